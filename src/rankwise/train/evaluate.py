"""Exact distributed evaluation.

Every rank evaluates a disjoint shard of the split; predictions, targets and sample
indices are gathered and the sampler's padding duplicates dropped, so the report counts
each sample exactly once whatever the world size.  (Evaluating the whole split on
every process instead would report each sample world_size times.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from rankwise.checkpoint import write_text_atomic
from rankwise.runtime import Runtime
from rankwise.train.rundir import RunDir


def forward_logits(model: nn.Module, batch: dict) -> torch.Tensor:
    """Run the model on a batch dict; every key but ``labels`` and ``index`` is a model input."""
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "index")}
    output = model(**inputs)
    return getattr(output, "logits", output)


@dataclass
class EvalResult:
    samples: int
    accuracy: float
    macro_f1: float
    weighted_f1: float
    report: dict
    """scikit-learn's classification_report as a dict."""
    report_text: str
    predictions: torch.Tensor
    targets: torch.Tensor

    def markdown(self, label_names: list[str], title: str) -> str:
        lines = [
            f"# {title}",
            "",
            f"samples: {self.samples}",
            "",
            "| class | precision | recall | f1-score | support |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in [*label_names, "macro avg", "weighted avg"]:
            row = self.report[name]
            lines.append(
                f"| {name} | {row['precision']:.4f} | {row['recall']:.4f} | {row['f1-score']:.4f} "
                f"| {int(row['support'])} |"
            )
        lines.append(f"| accuracy | | | {self.accuracy:.4f} | {self.samples} |")
        return "\n".join(lines) + "\n"


@torch.no_grad()
def gather_predictions(rt: Runtime, model: nn.Module, dataset, batch_size: int, collate_fn=None):
    """Predictions and targets of the whole ``dataset``, exactly once each, on every rank."""
    # evaluation batches need not divide evenly: round up
    per_rank = -(-batch_size // rt.world_size)
    gatherer = rt.eval_gatherer(len(dataset))
    was_training = model.training
    model.eval()
    for batch in rt.eval_loader(
        dataset, per_rank, collate_fn, lengths=getattr(dataset, "lengths", None)
    ):
        batch = rt.to_device(batch)
        with rt.autocast():
            logits = forward_logits(model, batch)
        # A split model's logits may sit on another device.
        gatherer.add(batch["index"], logits.argmax(dim=-1).to(rt.device), batch["labels"])
    model.train(was_training)
    _, predictions, targets = gatherer.result()
    return predictions.cpu(), targets.cpu()


def score(predictions: torch.Tensor, targets: torch.Tensor, label_names: list[str]) -> EvalResult:
    # slow import: only when scoring
    from sklearn.metrics import accuracy_score, classification_report, f1_score

    y_pred, y_true = predictions.numpy(), targets.numpy()
    labels = list(range(len(label_names)))
    kwargs = dict(labels=labels, target_names=label_names, zero_division=0, digits=4)
    return EvalResult(
        samples=len(y_true),
        accuracy=float(accuracy_score(y_true, y_pred)),
        macro_f1=float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        weighted_f1=float(
            f1_score(y_true, y_pred, labels=labels, average="weighted", zero_division=0)
        ),
        report=classification_report(y_true, y_pred, output_dict=True, **kwargs),
        report_text=classification_report(y_true, y_pred, **kwargs),
        predictions=predictions,
        targets=targets,
    )


def evaluate(
    rt: Runtime, model: nn.Module, dataset, label_names: list[str], batch_size: int, collate_fn=None
) -> EvalResult:
    predictions, targets = gather_predictions(rt, model, dataset, batch_size, collate_fn)
    return score(predictions, targets, label_names)


def write_report(path: str | Path, result: EvalResult, label_names: list[str], title: str) -> None:
    Path(path).write_text(result.markdown(label_names, title), encoding="utf-8")


def write_results(
    run_dir: RunDir, result: EvalResult, names: list[str], summary: dict, title: str
) -> None:
    """What a finished run writes (rank 0): report.md and report.txt, every evaluated sample's
    label and prediction, and result.json last, which says the run is complete."""
    write_report(run_dir.report_md, result, names, title)
    write_text_atomic(run_dir.report_txt, result.report_text)
    predictions = zip(result.predictions.tolist(), result.targets.tolist())
    lines = (
        json.dumps({"index": i, "label": names[t], "prediction": names[p]}, ensure_ascii=False)
        for i, (p, t) in enumerate(predictions)
    )
    write_text_atomic(run_dir.predictions, "".join(line + "\n" for line in lines))
    write_text_atomic(run_dir.result, json.dumps(summary, indent=2))
