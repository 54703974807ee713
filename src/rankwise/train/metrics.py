"""The training log of a run: ``metrics.jsonl`` and TensorBoard events, written by rank 0; the loss
summed on the device between two logged steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from rankwise.checkpoint import write_text_atomic
from rankwise.runtime import Runtime
from rankwise.train.rundir import RunDir


class MetricsLog:
    """metrics.jsonl and TensorBoard events, written by rank 0 only.

    A fresh run replaces what an earlier run left in the same directory.  A run resumed at
    step S keeps the records up to S and drops later ones, which it is about to log again.
    """

    def __init__(self, run_dir: RunDir, enabled: bool, resumed_step: int = 0):
        self.enabled = enabled
        self.file = None
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            path = run_dir.metrics
            kept = _records_up_to(path, resumed_step) if resumed_step else []
            # the earlier log stays whole until the kept part replaces it
            write_text_atomic(path, "".join(kept))
            self.file = open(path, "a", encoding="utf-8")
            events = run_dir.tensorboard
            if not resumed_step:
                shutil.rmtree(events, ignore_errors=True)
            # purge_step hides the earlier run's events after the checkpoint from TensorBoard.
            self.writer = SummaryWriter(
                str(events), purge_step=resumed_step + 1 if resumed_step else None
            )

    def log(self, step: int, **values) -> None:
        if not self.enabled:
            return
        assert self.file is not None and self.writer is not None  # enabled: opened in __init__
        self.file.write(json.dumps({"step": step, **values}) + "\n")
        self.file.flush()
        for key, value in values.items():
            if isinstance(value, (int, float)) and key not in ("epoch",):
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.enabled:
            assert self.file is not None and self.writer is not None  # enabled: opened in __init__
            self.file.close()
            self.writer.close()


def _records_up_to(path: Path, step: int) -> list[str]:
    if not path.exists():
        return []
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # blank, or cut short by the crash this run resumes from
        if record.get("step", 0) <= step:
            kept.append(line + "\n")
    return kept


class LossWindow:
    """The training loss summed on the device since it was last logged: no sync per step."""

    def __init__(self, device: torch.device):
        self.sum = torch.zeros((), device=device)
        self.steps = 0
        """Optimizer steps in the sum."""

    def add(self, micro_loss: torch.Tensor) -> None:
        self.sum += micro_loss

    def take_mean(self, rt: Runtime) -> float:
        """The mean loss per step over every rank since the last call, then an empty window (a
        collective)."""
        # Why: the only per-interval sync of the loop; .item() waits for the device.
        mean = rt.all_reduce(self.sum / self.steps, "mean").item()
        self.sum.zero_()
        self.steps = 0
        return mean
