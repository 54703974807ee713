"""The trace a watched run writes (:class:`~rankwise.tools.watch.lockstep.Lockstep`) is what
``rankwise verify`` compares: two traces written here, in one process, and compared into verify's
per-step lines."""

from __future__ import annotations

from pathlib import Path

import torch

from rankwise.tools.step_trace import StepRecord
from rankwise.tools.verify.command import build
from rankwise.tools.watch.lockstep import Lockstep
from rankwise.tools.watch.models import new_facts


def _trace(directory: Path, steps: int) -> None:
    """A run's trace as the watcher writes it: step 0's weights, then each step's record and
    weights (plain SGD at lr 0.1 on a loss whose gradient is 1)."""
    directory.mkdir(parents=True)
    weight = torch.nn.Parameter(torch.ones(4))
    lockstep = Lockstep(directory, None)
    lockstep.start([("w", weight)])
    for step in range(1, steps + 1):
        with torch.no_grad():
            weight -= 0.1
        record = StepRecord(samples=[f"sample{step}"], losses=[0.5], learning_rates=[0.1])
        lockstep.write(
            step,
            [record.as_dict() | {"weights_digest": "same"}],
            {"w": weight.detach().clone()},
            new_facts(keep_dropout=False),
        )


def test_verifys_lines_of_the_watched_steps_are_its_step_lines(tmp_path):
    """``steps`` meant three things (the watched count, the watcher's step part, these lines): the
    report's comparison step by step is ``step_lines``, and no key of it is called ``steps``."""
    for name in ("reference", "candidate"):
        _trace(tmp_path / name, steps=2)
    report = build(tmp_path, {"reference": {}, "candidate": {}}, "ddp", 2, steps_asked=2)
    assert [line["step"] for line in report["step_lines"]] == [0, 1, 2], report
    assert all(line["equivalent"] for line in report["step_lines"]), report["step_lines"]
    assert "steps" not in report
