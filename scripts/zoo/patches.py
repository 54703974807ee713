"""Unified diffs for the zoo's cpu.patch files, in pure Python (no `patch` binary, no process).

A case's patch turns the pinned originals into the copy the zoo runs.  Every hunk must add a line
containing ``zoo:`` that says why; a hunk applies only where its context matches exactly (no fuzz),
so a patch that has drifted from its originals fails instead of landing somewhere else.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_NEWLINE = "\\ No newline at end of file"


class PatchError(ValueError):
    """A patch that does not parse or does not apply: one line naming the file and hunk."""


@dataclass
class Hunk:
    old_start: int
    lines: list[str] = field(
        default_factory=list
    )  # " x\n", "-x\n", "+x\n" (newline kept as in the file)

    def old(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]

    def new(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " +"]

    def says_why(self) -> bool:
        return any(line[0] == "+" and "zoo:" in line for line in self.lines)


@dataclass
class FilePatch:
    path: str  # relative to the case dir (the a/ prefix removed)
    hunks: list[Hunk] = field(default_factory=list)


def _path(header: str) -> str:
    name = header[4:].split("\t")[0].strip()
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse(text: str) -> list[FilePatch]:
    """The files and hunks of a unified diff."""
    files: list[FilePatch] = []
    hunk: Hunk | None = None
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines, 1):
        if line.startswith("--- ") and number < len(lines) and lines[number].startswith("+++ "):
            files.append(FilePatch(_path(lines[number])))
            hunk = None
        elif line.startswith("+++ ") and files and not files[-1].hunks and hunk is None:
            continue
        elif match := HUNK.match(line):
            if not files:
                raise PatchError(f"line {number}: a hunk before any '---/+++' file header")
            hunk = Hunk(int(match.group(1)))
            files[-1].hunks.append(hunk)
        elif line.startswith(NO_NEWLINE[:12]) and hunk is not None and hunk.lines:
            hunk.lines[-1] = hunk.lines[-1].rstrip("\n")
        elif hunk is not None and line[:1] in (" ", "-", "+"):
            hunk.lines.append(line if line.endswith("\n") else line + "\n")
        elif hunk is not None and line in ("\n", ""):
            hunk.lines.append(" \n")  # an empty context line whose space an editor stripped
        elif line.strip() and hunk is not None:
            raise PatchError(f"line {number}: not a diff line: {line.rstrip()[:60]!r}")
    return files


def unexplained(files: list[FilePatch]) -> list[str]:
    """'file: hunk @@ -N' for every hunk that adds no line containing 'zoo:'."""
    return [f"{f.path}: hunk @@ -{h.old_start}" for f in files for h in f.hunks if not h.says_why()]


def apply(originals: dict[str, str], files: list[FilePatch]) -> dict[str, str]:
    """The patched texts of ``originals`` (name -> text); exact context, hunks in order."""
    result = dict(originals)
    for patch in files:
        if patch.path not in result:
            raise PatchError(
                f"{patch.path}: the patch changes a file that is not among the case's files"
            )
        lines = result[patch.path].splitlines(keepends=True)
        out: list[str] = []
        at = 0  # next original line (0-based) not yet copied
        for hunk in patch.hunks:
            start = max(hunk.old_start - 1, 0) if hunk.old() else hunk.old_start
            old = hunk.old()
            if start < at or lines[start : start + len(old)] != old:
                raise PatchError(
                    f"{patch.path}: hunk @@ -{hunk.old_start} does not apply (context not at "
                    f"line {hunk.old_start} of the original)"
                )
            out += lines[at:start] + hunk.new()
            at = start + len(old)
        result[patch.path] = "".join(out + lines[at:])
    return result


def make(originals: dict[str, str], edited: dict[str, str]) -> str:
    """A unified diff (a/NAME, b/NAME) from ``originals`` to ``edited``, for a case's cpu.patch."""
    chunks: list[str] = []
    for name, text in originals.items():
        if edited.get(name, text) == text:
            continue
        diff = difflib.unified_diff(
            text.splitlines(keepends=True),
            edited[name].splitlines(keepends=True),
            f"a/{name}",
            f"b/{name}",
        )
        for line in diff:
            chunks.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE + "\n")
    return "".join(chunks)
