"""The zoo's cases: zoo/<case>/case.toml (format: docs/reference/zoo.md), read and checked.

A case is one public training script pinned to a commit, its CPU edits as cpu.patch and what a
correct tool must say about it.  ``problems`` lists everything wrong with a case in one line each
(the unit test and the runner both refuse a case that has any).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import patches
import tomllib

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo"
FRAMEWORKS = (
    "torch",
    "spawn",
    "accelerate",
    "trainer",
    "fabric",
    "lightning",
    "deepspeed",
    "horovod",
)
VERDICTS = ("equivalent", "not equivalent", "not comparable", "vacuous")
CAUSES = (
    "samples", "batch-dependent", "random", "own-batches", "half", "loss-scaled", "loss-mean",
    "no-grad", "comm-hook", "gradient", "learning-rate", "scheduler", "hyperparameters", "update",
    "steps",
)  # fmt: skip
FINDINGS = (
    "not-joined", "unsharded", "epochs", "counted-more", "evaluated-whole",
    "replicas", "shared-save", "module-prefix", "sync-point", "host-read", "per-rank-metric",
)  # fmt: skip
KINDS = CAUSES + FINDINGS
REQUIRED = {
    "source": ("repo", "commit", "path", "files", "license", "launch"),
    "run": ("framework", "args", "steps", "fast"),
    "expect": ("verdict", "defects", "why"),
}


@dataclass
class Case:
    name: str
    dir: Path
    source: dict = field(default_factory=dict)
    run: dict = field(default_factory=dict)
    expect: dict = field(default_factory=dict)

    @property
    def script(self) -> str:
        return self.source["files"][0]

    @property
    def url(self) -> str:
        """The script's source at its commit on GitHub."""
        return f"https://github.com/{self.source['repo']}/blob/{self.source['commit']}/{self.source['path']}"

    def originals(self) -> dict[str, str]:
        return {name: (self.dir / name).read_text() for name in self.source["files"]}

    def patch(self) -> list[patches.FilePatch]:
        path = self.dir / "cpu.patch"
        return patches.parse(path.read_text()) if path.exists() else []

    def patched(self) -> dict[str, str]:
        """The files the zoo runs: the originals with cpu.patch applied."""
        return patches.apply(self.originals(), self.patch())


def load(directory: Path) -> Case:
    data = tomllib.loads((directory / "case.toml").read_text())
    return Case(
        directory.name,
        directory,
        data.get("source", {}),
        data.get("run", {}),
        data.get("expect", {}),
    )


def all_cases(zoo: Path = ZOO) -> list[Path]:
    return sorted(p for p in zoo.iterdir() if (p / "case.toml").is_file()) if zoo.is_dir() else []


def problems(directory: Path) -> list[str]:
    """One line per thing wrong with the case in ``directory`` (empty: the case is sound)."""
    where = f"zoo/{directory.name}/case.toml"
    try:
        case = load(directory)
    except (OSError, tomllib.TOMLDecodeError) as error:
        return [f"{where}: {error}"]
    found = [
        f"{where}: [{table}] has no key '{key}'"
        for table, keys in REQUIRED.items()
        for key in keys
        if key not in getattr(case, table)
    ]
    if found:
        return found
    if not re.fullmatch(r"[0-9a-f]{40}", str(case.source["commit"])):
        found.append(f"{where}: [source] commit is not 40 hex digits: {case.source['commit']!r}")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", str(case.source["repo"])):
        found.append(f"{where}: [source] repo is not owner/name: {case.source['repo']!r}")
    files = case.source["files"]
    if not files or not Path(case.source["path"]).name == files[0]:
        found.append(
            f"{where}: [source] files must start with the script ({Path(case.source['path']).name})"
        )
    found += [
        f"{where}: [source] files: {name} is not in the case dir"
        for name in files
        if not (directory / name).is_file()
    ]
    if case.run["framework"] not in FRAMEWORKS:
        found.append(
            f"{where}: [run] framework {case.run['framework']!r} is not one of "
            f"{', '.join(FRAMEWORKS)}"
        )
    if not isinstance(case.run["args"], list) or not all(
        isinstance(a, str) for a in case.run["args"]
    ):
        found.append(f"{where}: [run] args must be a list of strings")
    if not isinstance(case.run["steps"], int) or case.run["steps"] < 1:
        found.append(f"{where}: [run] steps must be a positive integer")
    if case.expect["verdict"] not in VERDICTS:
        found.append(
            f"{where}: [expect] verdict {case.expect['verdict']!r} is not one of "
            f"{', '.join(VERDICTS)}"
        )
    for key in ("defects", "allowed"):
        found += [
            f"{where}: [expect] {key}: {kind!r} is not a known kind"
            for kind in case.expect.get(key, [])
            if kind not in KINDS
        ]
    if "bench" in case.expect and (
        case.expect["bench"] != "could not run" or not str(case.expect.get("bench_why", "")).strip()
    ):
        found.append(
            f'{where}: [expect] bench may only be "could not run", with bench_why saying why no '
            "timed run can measure the script"
        )
    if not str(case.expect["why"]).strip():
        found.append(
            f"{where}: [expect] why is empty: what in the script makes the verdict and each defect"
        )
    if found:
        return found
    try:
        patch = case.patch()
        found += [
            f"zoo/{directory.name}/cpu.patch: {hunk} adds no line with 'zoo:' (why)"
            for hunk in patches.unexplained(patch)
        ]
        case.patched()
    except patches.PatchError as error:
        found.append(f"zoo/{directory.name}/cpu.patch: {error}")
    return found


def licenses(dirs: list[Path]) -> str:
    """zoo/LICENSES.md: one line per case (repository, commit, path, licence)."""
    lines = [
        "# Licences of the zoo's scripts",
        "",
        "Each case under zoo/ holds files copied byte for byte from a public repository at a "
        "pinned commit (cpu.patch holds the zoo's edits); they keep their own licence, named here "
        "(written by `python scripts/zoo --licenses` from the manifests).",
        "",
    ]
    for directory in dirs:
        case = load(directory)
        source = case.source
        lines.append(
            f"- {case.name}: {source['repo']} @ {source['commit']}, {source['path']} "
            f"(+ {', '.join(source['files'][1:]) or 'no other file'}): {source['license']}"
        )
    return "\n".join(lines) + "\n"
