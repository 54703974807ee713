"""A script rankwise plan cannot run: one line naming the script's file and line and what failed
there, exit 4 (errors.COULD_NOT_RUN), the traceback in a file beside the plan."""

from __future__ import annotations

import pytest

from rankwise import cli
from rankwise.errors import COULD_NOT_RUN
from tests.support.cli import ROOT

SCRIPT = ROOT / "tests/support/tools/plan/cannot_plan.py"


def _line_of(marker: str) -> int:
    lines = SCRIPT.read_text(encoding="utf-8").splitlines()
    return next(n for n, text in enumerate(lines, 1) if marker in text)


@pytest.mark.parametrize(
    ("fail", "marker", "doing", "raised"),
    [
        (
            "value",
            "# FAILS BEFORE",
            "could not run it up to its first training step",
            "DataDependentOutputException",
        ),
        (
            "replay",
            "# FAILS IN THE REPLAY",
            "could not replay its training step on fake tensors",
            "DynamicOutputShapeException",
        ),
    ],
)
def test_a_script_plan_cannot_run_gets_one_line(fail, marker, doing, raised, tmp_path, capsys):
    out = tmp_path / "plan"
    status = cli.main(["plan", str(SCRIPT), "--no-timing", "--out", str(out), "--", "--fail", fail])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == COULD_NOT_RUN == 4
    last = err[-1]
    assert last.startswith(f"rankwise plan: {SCRIPT}:{_line_of(marker)}: {doing}"), last
    assert raised in last and "fake tensors have shapes, no values" in last
    assert "Traceback" not in "\n".join(err)  # one line, no traceback on the terminal ...
    saved = out / "plan-error.txt"
    assert f"traceback in {saved}" in last and "Traceback" in saved.read_text()  # ... but kept
    if fail == "replay":
        assert f"the step captured at line {_line_of('# THE TRAINING STEP')}" in last
