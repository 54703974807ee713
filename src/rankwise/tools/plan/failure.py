"""A script ``rankwise plan`` cannot run, said on one line: the script's file and line, what failed
there, and what the plan was doing (exit :data:`~rankwise.errors.COULD_NOT_RUN`, 4).

The line is the innermost frame of the error's traceback in the script's own file (the script's
code, or its model's ``forward`` where the script defines it); where the error never passed through
the script (a library's layer failing in the replay), the line of the call the capture stopped at
(:attr:`~rankwise.tools.plan.capture.Capture.line`).  The full traceback goes to a file beside the
plan's output, for a bug report, and the one line names it.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from rankwise.errors import ScriptNotRun

VALUE_READS = ("DataDependentOutputException", "DynamicOutputShapeException")
"""What torch's fake tensors raise where an operation needs a tensor's value (``.item()``, a
``nonzero``), named so that the message says it (no import of the private module raising them)."""


def _same_file(filename: str, script: Path) -> bool:
    try:
        return Path(filename).resolve() == script.resolve()
    except OSError:
        return False


def script_line(frames: traceback.StackSummary, script: Path) -> int | None:
    """The innermost of ``frames`` in ``script``'s file, its line number, or ``None``."""
    lines = [frame.lineno for frame in frames if _same_file(frame.filename, script)]
    return lines[-1] if lines else None


def called_at(script: Path) -> int | None:
    """The innermost line of ``script`` on the current stack (where it made the call running
    now)."""
    return script_line(traceback.extract_stack(), script)


def not_run(
    script: Path,
    error: BaseException,
    doing: str,
    *,
    line: int | None = None,
    traceback_file: Path | None = None,
) -> ScriptNotRun:
    """The one-line error for ``error``, raised while ``doing`` (see the module's docstring);
    ``line``: the script's line to name where the traceback has none."""
    frames = traceback.extract_tb(error.__traceback__)
    at = script_line(frames, script) or line
    where = f"{script}:{at}" if at else str(script)
    text = str(error).strip().splitlines()
    what = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    if type(error).__name__ in VALUE_READS:
        what += " (a value read: fake tensors have shapes, no values)"
    raised = ""
    if frames and not _same_file(frames[-1].filename, script):
        raised = f" (raised at {Path(frames[-1].filename).name}:{frames[-1].lineno})"
    saved = ""
    if traceback_file is not None:
        try:
            traceback_file.parent.mkdir(parents=True, exist_ok=True)
            traceback_file.write_text("".join(traceback.format_exception(error)), encoding="utf-8")
            saved = f"; traceback in {traceback_file}"
        except OSError:
            pass  # (the one line is the report; the file only a help)
    return ScriptNotRun(f"{where}: could not {doing}: {what}{raised}{saved}")
