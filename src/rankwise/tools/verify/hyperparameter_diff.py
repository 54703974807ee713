"""The optimizer's settings in the two runs, compared exactly step by step, and the causes their
differences are.

Before every optimizer step each run recorded every parameter group's hyper-parameters and the
state of every learning-rate scheduler driving the optimizer
(:mod:`rankwise.tools.watch.hyperparameters`).
Distributing the same training changes none of them, so they must be equal, bit for bit: a learning
rate that differs by one part in a million is a difference, whether or not the weights show it.
Kinds: ``scheduler`` (a scheduler stepped another number of times: its ``last_epoch`` or
``_step_count`` differ, and the learning rate with them), ``learning-rate`` (a group's ``lr``,
``initial_lr``, a scheduler's ``base_lrs`` or ``_last_lr``), ``hyperparameters`` (any other key).

A scheduler's position alone (``last_epoch``, ``_step_count``, its count and class: kind
``scheduler``) is compared exactly too, but is not by itself a difference in training: Accelerate's
documented fix for its per-process stepping keeps stepping the scheduler N times per optimizer step
and builds it with N times the step counts, so the learning rates are the same, bit for bit, while
``last_epoch`` runs N times faster.  A position that differs is named as the cause when the
learning rate or another setting differs with it (:func:`changes_training`); where it goes on to
change the rate at a later step, that step differs.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from rankwise.tools.verify.records import SettingDifference, StepLine, TracedStep


class TracedRun(Protocol):
    """A traced run's step records (:class:`rankwise.tools.verify.compare.TracedRun`, which imports
    this module)."""

    records: dict[int, list[TracedStep]]


IMPLEMENTATION = frozenset({"foreach", "fused", "capturable", "differentiable"})
"""Group keys that choose torch's kernel for the same arithmetic, not the arithmetic: recorded, not
compared."""

SCHEDULER_STEPS = frozenset({"last_epoch", "_step_count"})
LEARNING_RATE = frozenset({"lr", "initial_lr", "base_lrs", "_last_lr"})


def same(one: Any, other: Any) -> bool:
    """Exact equality of two recorded values, NaN equal to NaN (a plateau scheduler's ``best``
    before any metric), 2 equal to 2.0 (JSON), a flag equal only to a flag."""
    if isinstance(one, bool) or isinstance(other, bool):
        return one is other
    if isinstance(one, float) and math.isnan(one):
        return isinstance(other, float) and math.isnan(other)
    if isinstance(one, list) and isinstance(other, list):
        return len(one) == len(other) and all(same(a, b) for a, b in zip(one, other, strict=True))
    return one == other


def changes_training(found: list[SettingDifference]) -> bool:
    """Whether the differences change what the optimizer does: any but a scheduler's position."""
    return any(d["kind"] != "scheduler" for d in found)


def _kind(key: str, scheduler: bool) -> str:
    if scheduler and key in SCHEDULER_STEPS | {"scheduler", "schedulers"}:
        return "scheduler"
    return "learning-rate" if key in LEARNING_RATE else "hyperparameters"


def _mappings(
    ones: list[dict], manys: list[dict], what: str, scheduler: bool
) -> list[SettingDifference]:
    found: list[SettingDifference] = []
    if len(ones) != len(manys):
        key = "schedulers" if scheduler else "groups"
        found.append(
            {
                "where": what,
                "key": key,
                "one": len(ones),
                "many": len(manys),
                "kind": _kind(key, scheduler),
            }
        )
    for index, (one, many) in enumerate(zip(ones, manys, strict=False)):
        name = f"{what} {index}" + (f" ({one.get('scheduler')})" if scheduler else "")
        for key in [*one, *(k for k in many if k not in one)]:
            if key in IMPLEMENTATION or same(one.get(key), many.get(key)):
                continue
            found.append(
                {
                    "where": name,
                    "key": key,
                    "one": one.get(key),
                    "many": many.get(key),
                    "kind": _kind(key, scheduler),
                }
            )
    return found


def differences(one: TracedStep, many: TracedStep) -> list[SettingDifference]:
    """Every setting that differs before the step between the one process (``one``) and the N-rank
    run (``many``, rank 0's record); none where either run did not record them."""
    if "hyperparameters" not in one or "hyperparameters" not in many:
        return []
    return _mappings(one["hyperparameters"], many["hyperparameters"], "group", False) + _mappings(
        one.get("schedulers", []), many.get("schedulers", []), "scheduler", True
    )


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list) and len(value) == 1:
        return _value(value[0])
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value[:4]) + (", …]" if len(value) > 4 else "]")
    return "none" if value is None else str(value)


def listed(found: list[SettingDifference], world_size: int) -> str:
    """The differences in words: where, which key, both values."""
    return "; ".join(
        f"{d['where']} {d['key']}: one process {_value(d['one'])}, {world_size} ranks "
        f"{_value(d['many'])}"
        for d in found[:6]
    ) + (f" and {len(found) - 6} more" if len(found) > 6 else "")


def _advance(run: TracedRun, step: int, index: int) -> int | None:
    """How many times scheduler ``index`` stepped between optimizer steps ``step - 1`` and
    ``step`` (its ``last_epoch`` before each)."""
    now, before = run.records.get(step), run.records.get(step - 1)
    if not now or not before:
        return None
    schedulers = now[0].get("schedulers", []), before[0].get("schedulers", [])
    if len(schedulers[0]) <= index or len(schedulers[1]) <= index:
        return None
    now_epoch, before_epoch = (
        schedulers[0][index].get("last_epoch"),
        schedulers[1][index].get("last_epoch"),
    )
    if isinstance(now_epoch, int) and isinstance(before_epoch, int):
        return now_epoch - before_epoch
    return None


# What Accelerate does, in accelerate 1.15's accelerate/scheduler.py, AcceleratedScheduler.step (the
# wrapper accelerator.prepare puts around a scheduler; step_with_optimizer is
# Accelerator(step_scheduler_with_optimizer=...), True by default):
#
#     if not self.step_with_optimizer:
#         # No link between scheduler and optimizer -> just step
#         self.scheduler.step(*args, **kwargs)
#         return
#     ...
#     if self.split_batches:
#         # Split batches -> the training dataloader batch size is not changed so one step per
#         # training step
#         self.scheduler.step(*args, **kwargs)
#     else:
#         # Otherwise the training dataloader batch size was multiplied by `num_processes`, so we
#         # need to do num_processes steps per training step
#         num_processes = AcceleratorState().num_processes
#         for _ in range(num_processes):
#             ...
#                 self.scheduler.step(*args, **kwargs)
#
# The cause is named from what the runs recorded (the wrapped torch scheduler's last_epoch advanced
# N times per optimizer step on N ranks, once in one process), not from this code: a release that
# changes it changes the evidence.
ACCELERATE = (
    "Accelerate's AcceleratedScheduler steps the scheduler it wraps num_processes times per "
    "optimizer step (Accelerator(split_batches=False), the default: it counts the {n} ranks' "
    "batches as {n} steps of one process's per-process batch), while one process taking the same "
    "global batch steps it once, so every step count the schedule holds (a warm-up of a fixed "
    "number of steps) passes {n}x sooner on {n} ranks. Fix one of: build the scheduler with its "
    "step counts in per-process batches — a fixed num_warmup_steps, and a num_training_steps "
    "taken from the prepared (sharded) loader, multiplied by accelerator.num_processes, as "
    "Accelerate's performance guide says (its learning rates are then one process's, step for "
    "step); or Accelerator(step_scheduler_with_optimizer=False) and call the scheduler's step() "
    "once per optimizer step yourself; or Accelerator(split_batches=True), whose loaders split "
    "the batch you give them over the ranks and whose scheduler steps once per optimizer step"
)


def causes(
    reference: TracedRun,
    candidate: TracedRun,
    line: StepLine,
    world_size: int,
    framework: str | None,
) -> list[tuple[str, str]]:
    """The causes the step's setting differences are, as ``(kind, text)``: the schedulers' first
    (another step count explains the learning rate it sets), then the learning rates, then the
    rest."""
    found = line.get("settings_diffs") or []
    if not changes_training(found):
        return []
    step, out = line["step"], []
    by_kind = {
        kind: [d for d in found if d["kind"] == kind]
        for kind in ("scheduler", "learning-rate", "hyperparameters")
    }
    rates = by_kind["learning-rate"]
    if by_kind["scheduler"]:
        first = by_kind["scheduler"][0]
        index = int(first["where"].split()[1]) if first["where"].split()[1].isdigit() else 0
        one, many = _advance(reference, step, index), _advance(candidate, step, index)
        stepped = (
            f": it stepped {many} time{'s' if many != 1 else ''} per optimizer step on the "
            f"{world_size} ranks and {one} in one process"
            if one is not None and many is not None and one != many
            else ""
        )
        # (the step count, and the rates it set: the rest says the same again)
        shown = [d for d in by_kind["scheduler"] if d["key"] != "_step_count"] + [
            d for d in rates if d["where"].startswith("group")
        ]
        text = (
            f"the learning-rate scheduler did not step as in one process before step {step} "
            f"({listed(shown, world_size)}){stepped}"
        )
        if framework == "accelerate" and one and many == world_size * one:
            text += ". " + ACCELERATE.format(n=world_size)
        else:
            text += (
                ". A scheduler must step once per optimizer step in both: one stepped per "
                "micro-batch or per rank, or one whose length is computed from the per-rank "
                "batch count, runs at another pace on N ranks"
            )
        out.append(("scheduler", text))
        rates = []
    if rates:
        rate = next((d for d in rates if d["key"] == "lr"), rates[0])
        one, many = rate["one"], rate["many"]
        ratios = {
            round(d["many"] / d["one"], 3)
            for d in rates
            if isinstance(d["one"], float) and isinstance(d["many"], float) and d["one"]
        }
        scaled = (
            f": {world_size}x, the script scales it by the world size"
            if ratios == {float(world_size)}
            else ""
        )
        out.append(
            (
                "learning-rate",
                f"the optimizer's learning rate differs at step {step}: one process "
                f"{_value(one)}, {world_size} ranks {_value(many)}{scaled} "
                f"({listed(rates, world_size)}). The {world_size} ranks already average their "
                "gradients over the global batch, as one process computes it: another rate is a "
                "change of the hyper-parameters, not what distributing the same training needs",
            )
        )
    if by_kind["hyperparameters"]:
        out.append(
            (
                "hyperparameters",
                f"the optimizer's hyper-parameters differ at step {step} "
                f"({listed(by_kind['hyperparameters'], world_size)}): a setting that depends on "
                "the world size or the rank changes the training, not only its distribution",
            )
        )
    return out
