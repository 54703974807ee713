"""Two traced runs of one script (:mod:`rankwise.tools.step_trace`), compared step by step.

The one-process run followed the N-rank run in lockstep: each step started from the N-rank run's
weights and applied the N-rank gradient.  For every step both runs reached: the samples (the N ranks
together against the one process), the loss (the mean over ranks of each rank's summed micro-batch
losses against the one process's sum: both are the global batch's loss when the loss is a mean over
it), the gradient the N-rank optimizer received against the one process's at the same weights
(:func:`rankwise.measure.tolerance.gradient_difference`), the optimizer's settings before the step
(every group's hyper-parameters and every scheduler's state, exactly:
:mod:`rankwise.tools.verify.hyperparameter_diff`), and each tensor's update, the weights after the
step less the weights it started from, against one process's update of it, relative to that update's
size (:func:`rankwise.measure.tolerance.update_difference`).  A step is equivalent when its samples
match, its loss is within the tolerance (relative above 1), its gradient within the gradient
tolerance, its settings equal and every tensor's update within the update tolerance.  Step 0 (the
weights as built) has no update: its weights are compared within the tolerance, a reproducibility
warning.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from rankwise.checkpoint import read_weights
from rankwise.measure.tolerance import UPDATE, tensor_differences, update_difference
from rankwise.tools.step_trace import FACTS_FILE, TRACE_FILE, gradients_file, weights_file
from rankwise.tools.verify.hyperparameter_diff import changes_training
from rankwise.tools.verify.hyperparameter_diff import differences as setting_differences
from rankwise.tools.verify.records import StepLine, TracedStep

TOP_TENSORS = 3


@dataclass
class TracedRun:
    directory: Path
    probe: dict = field(default_factory=dict)
    """``probe.json``: empty when the script ended before the probe's last step."""
    facts: dict = field(default_factory=dict)
    records: dict[int, list[TracedStep]] = field(default_factory=dict)
    """Step -> each rank's record."""

    @classmethod
    def load(cls, directory: Path) -> TracedRun:
        run = cls(directory)
        if (directory / "probe.json").exists():
            run.probe = json.loads((directory / "probe.json").read_text(encoding="utf-8"))
        if (directory / FACTS_FILE).exists():
            run.facts = json.loads((directory / FACTS_FILE).read_text(encoding="utf-8"))
        if (directory / TRACE_FILE).exists():
            for line in (directory / TRACE_FILE).read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                run.records[record["step"]] = record["ranks"]
        return run

    @property
    def reached(self) -> int:
        """Optimizer steps the run recorded."""
        return max(self.records, default=0)

    def seen(self, what: Literal["samples", "losses"]) -> bool:
        """Whether any rank recorded ``samples`` (batches a DataLoader yielded, a backward consumed)
        or ``losses``."""
        return any(rank[what] for ranks in self.records.values() for rank in ranks)

    @property
    def steps(self) -> list[int]:
        """Steps whose weights were written, 0 (as prepared) first."""
        return [
            step
            for step in [0, *sorted(self.records)]
            if weights_file(self.directory, step).exists()
        ]

    def weights(self, step: int) -> dict[str, torch.Tensor]:
        return read_weights(weights_file(self.directory, step))

    def loss(self, step: int) -> float | None:
        """The step's loss: the mean over ranks of each rank's summed micro-batch losses."""
        ranks = self.records.get(step) or []
        if not ranks or not all(rank["losses"] for rank in ranks):
            return None
        return sum(sum(rank["losses"]) for rank in ranks) / len(ranks)


def compare_samples(reference: list[TracedStep], candidate: list[TracedStep]) -> tuple[str, str]:
    """One step's samples, the N ranks together against the one process: ``("same" | "differs" |
    "unmatched" | "made" | "unseen", detail)``.  ``differs``: other counts, or every rank saw the
    same samples (a failure by itself); ``unmatched``: as many samples, other digests (another
    order, or padding the digest does not recognise).  A script that makes its own batches (no
    DataLoader) is compared by its model's training inputs: ``made`` where they differ (the one
    process cannot take the N ranks' batch: what it draws is its own), ``unseen`` where none were
    recorded."""
    one = Counter(reference[0]["samples"]) if reference else Counter()
    ranks = [Counter(rank["samples"]) for rank in candidate]
    together = sum(ranks, Counter())
    made = not one and not together
    if made:
        # (a script that makes its own batches: the model's inputs are what its data is known by)
        one = Counter(reference[0].get("inputs", [])) if reference else Counter()
        ranks = [Counter(rank.get("inputs", [])) for rank in candidate]
        together = sum(ranks, Counter())
        if not one and not together:
            return "unseen", "no training batch came from a DataLoader"
    n, seen, expected = len(ranks), sum(together.values()), sum(one.values())
    # (even when one process took them too)
    if n > 1 and ranks[0] and all(rank == ranks[0] for rank in ranks[1:]):
        return "differs", (
            f"each of the {n} ranks saw the same {sum(ranks[0].values())} samples ({seen} "
            f"together); the one process saw {expected}"
        )
    if together == one:
        return "same", ""
    shared = sum((together & one).values())
    if made:
        return "made", (
            f"the script makes its own batches (no DataLoader), and the {n} ranks' model inputs "
            f"are not the one process's: {shared} of their {seen} rows among its {expected}"
        )
    detail = (
        f"the {n} ranks saw {seen} samples, {shared} of them among the one process's {expected}"
    )
    return ("unmatched" if seen == expected else "differs"), detail


def random_ops(run: TracedRun) -> dict[str, int]:
    """The random operations the run's forward ran, as ``{"op in module": count}`` (its first
    step's)."""
    found: dict[str, int] = {}
    for ranks in run.records.values():
        for key, count in ranks[0].get("random_ops", {}).items():
            found[key] = found.get(key, 0) + count
    return found


def coarsest(dtypes: list[str] | None) -> torch.dtype | None:
    """The coarsest of the 16-bit parameter dtypes a run's facts name (``bfloat16`` over
    ``float16``: fewer significant bits), or None for fp32 parameters."""
    held = [getattr(torch, name) for name in dtypes or () if hasattr(torch, name)]
    return max(held, key=lambda dtype: torch.finfo(dtype).eps, default=None)


def compare(
    reference: TracedRun,
    candidate: TracedRun,
    tolerance: float,
    gradient_tolerance: float | None = None,
    update_tolerance: float = UPDATE,
) -> list[StepLine]:
    """One line per step both runs reached (step 0: the weights as prepared)."""
    lines: list[StepLine] = []
    held_in = coarsest(candidate.facts.get("half_params") or reference.facts.get("half_params"))
    # (the weights each run started the step from: the N-rank run's after its step before)
    before: tuple[dict, dict, int] | None = None
    for step in [s for s in reference.steps if s in candidate.steps]:
        ref_weights, cand_weights = reference.weights(step), candidate.weights(step)
        differences = tensor_differences(cand_weights, ref_weights)
        unmatched = sorted(
            set(ref_weights) ^ set(cand_weights)
            | {k for k in ref_weights if k in cand_weights and k not in differences}
        )
        line: StepLine = {
            "step": step,
            "max_param_diff": max(differences.values(), default=0.0),
            "top": sorted(differences.items(), key=lambda item: -item[1])[:TOP_TENSORS],
            "unmatched_tensors": unmatched,
            "data": "—",
            "data_detail": "",
            "loss_reference": None,
            "loss_candidate": None,
            "loss_diff": None,
            "followed": False,
            "gradient_diff": None,
            "gradient_top": [],
            "gradient_scale": None,
            "gradient_only_one": [],
            "update_diff": None,
            "update_top": [],
            "settings_diffs": [],
        }
        if step:
            ours = reference.records[step][0]
            gradient = ours.get("gradient")
            line["followed"] = bool(ours.get("followed"))
            line["settings_diffs"] = setting_differences(ours, candidate.records[step][0])
            if gradient:
                line |= {
                    "gradient_diff": gradient["difference"],
                    "gradient_top": gradient["top"],
                    "gradient_scale": gradient["scale"],
                    "gradient_only_one": gradient["only_one"],
                }
            line["data"], line["data_detail"] = compare_samples(
                reference.records[step], candidate.records[step]
            )
            one, many = reference.loss(step), candidate.loss(step)
            line |= {
                "loss_reference": one,
                "loss_candidate": many,
                "loss_diff": abs(one - many) if one is not None and many is not None else None,
            }
        if step and before is not None and before[2] == step - 1:
            # In lockstep both runs started the step from the N-rank weights, else each from its own
            update = update_difference(
                cand_weights,
                ref_weights,
                before[1],
                before[1] if line["followed"] else before[0],
                held_in=held_in,
            )
            # (a step taken from other weights, with another gradient, is judged on the whole
            # update: a tensor whose update is all rounding, as Adam's of a gradient near eps is,
            # cannot be judged alone)
            line["update_diff"] = update["difference"] if line["followed"] else update["whole"]
            line["update_top"] = update["top"]
        before = (ref_weights, cand_weights, step)
        loss_diff, loss_reference = line["loss_diff"], line["loss_reference"]
        line["loss_ok"] = loss_diff is None or loss_diff <= tolerance * max(
            1.0, abs(loss_reference or 0.0)
        )
        update_diff = line["update_diff"]
        if update_diff is None:
            # step 0 (as built), or a step whose start was not written: the weights themselves
            line["update_ok"] = line["max_param_diff"] <= tolerance
        else:
            limit = (
                update_tolerance
                if line["followed"]
                else max(update_tolerance, gradient_tolerance or 0)
            )
            line["update_ok"] = update_diff <= limit
        line["settings_ok"] = not changes_training(line["settings_diffs"])
        line["params_ok"] = line["update_ok"] and not unmatched
        gradient_diff = line["gradient_diff"]
        line["gradient_ok"] = not line["gradient_only_one"] and (
            gradient_diff is None
            or gradient_tolerance is None
            or gradient_diff <= gradient_tolerance
        )
        line["equivalent"] = (
            line["params_ok"]
            and line["settings_ok"]
            and line["loss_ok"]
            and line["gradient_ok"]
            and line["data"] not in ("differs", "made")
        )
        if line["data"] == "unmatched" and line["equivalent"]:
            line["data_detail"] += (
                " (loss and weights agree: probably padding the digest does not recognise)"
            )
        lines.append(line)
    return lines


def first_difference(lines: list[StepLine]) -> StepLine | None:
    """The first optimizer step that differs.  Step 0 (the weights as built) is not one: the one
    process starts from the N-rank run's weights whatever it built, so a script whose initialisation
    differs run to run is a reproducibility warning (:func:`start_differs`), not something
    distribution changed."""
    return next((line for line in lines if line["step"] and not line["equivalent"]), None)


def start_differs(lines: list[StepLine]) -> str | None:
    """A warning when the two runs built different weights (step 0), or ``None``."""
    start = next((line for line in lines if line["step"] == 0), None)
    if start is None or start["params_ok"]:
        return None
    name, difference = start["top"][0] if start["top"] else ("?", start["max_param_diff"])
    followed = any(line.get("followed") for line in lines if line["step"])
    return (
        f"two runs of this script start from different weights ({name} differs by {difference:.1e} "
        "as built): its initialisation is not reproducible — the model is built before any seed "
        "is set, or with a seed taken per rank or from the clock. "
        + (
            "The reference started from the N-rank run's weights, so the steps above compare what "
            "distribution changed; seed the script (torch.manual_seed before the model is built) "
            "to make runs repeatable"
            if followed
            else "The reference could not start from the N-rank run's weights, so every step "
            "compares different models: seed the script before the model is built"
        )
    )


def nothing_trained(candidate: TracedRun, lines: list[StepLine]) -> str | None:
    """Why the compared steps prove nothing, or ``None``: every loss exactly 0, every gradient 0, or
    weights that never changed.  Read before the per-step files are deleted."""
    steps = [line["step"] for line in lines if line["step"]]
    if not steps:
        return None
    losses = [candidate.loss(step) for step in steps]
    gradients = [gradients_file(candidate.directory, step) for step in steps]
    why = []
    if losses and all(loss == 0.0 for loss in losses):
        why.append("the loss was exactly 0 at every step")
    read = [read_weights(path) for path in gradients if path.exists()]
    if (
        len(read) == len(gradients)
        and all(read)
        and all(not t.any() for tensors in read for t in tensors.values())
    ):
        why.append("every gradient was 0")  # (a step with no gradient recorded tells nothing)
    weights = [step for step in [0, *steps] if weights_file(candidate.directory, step).exists()]
    if len(weights) > 1 and all(
        max(
            tensor_differences(candidate.weights(after), candidate.weights(before)).values(),
            default=0.0,
        )
        == 0
        for before, after in zip(weights, weights[1:], strict=False)
    ):
        why.append("the weights never changed")
    return "; ".join(why) or None
