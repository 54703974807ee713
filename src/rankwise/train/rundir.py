"""The layout of a ``rankwise train`` run directory: every file name in one place.

::

    <out>/
        config.json          the validated configuration the workers read
        data/                the prepared data (splits, tokenizer.json, stats.json)
        metrics.jsonl        one JSON record per logged step (rank 0)
        tensorboard/         the same as TensorBoard events
        checkpoints/         step-N/ checkpoints, latest -> the newest complete one
        report.md            per-class precision / recall / F1 of the evaluated split
        report.txt           scikit-learn's classification report
        predictions.jsonl    every evaluated sample's label and prediction
        result.json          the run's summary (what --json prints)
        continuity.json      after a resume: where the data continued, checked at its first step
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LAUNCH_ID = "RANKWISE_LAUNCH_ID"
"""The launching process's id, inherited by its workers: rank 0 records it in ``result.json``, so of
the nodes sharing one run directory only the one whose workers wrote the result reports it."""


@dataclass(frozen=True)
class RunDir:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def tokenizer(self) -> Path:
        return self.data / "tokenizer.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def latest(self) -> Path:
        return self.checkpoints / "latest"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_txt(self) -> Path:
        return self.root / "report.txt"

    @property
    def predictions(self) -> Path:
        return self.root / "predictions.jsonl"

    @property
    def result(self) -> Path:
        return self.root / "result.json"
