"""One rank's real training step, its memory measured the way rankwise plan's replay measures its
own (:class:`rankwise.tools.plan.fake_step.StepTracker`), for the plan's formulas to be checked
against: what the rank holds before the step (every tensor the garbage collector finds, each
storage once), and the most the step adds in each phase.

Every storage alive before the step is made known to the tracker first: an operation of the step
that returns a view of one (a slice of DeepSpeed's kept reduce bucket, of its flat gradient
partitions or optimizer state) otherwise counts it as created, and the step seems to add what the
rank held already (that made a real ZeRO-3 step's backward pass look 20 MB larger on the accounting
model, 2026-11-29)."""

from __future__ import annotations

import contextlib
import gc

import torch

from tests.support.tools.plan.accounting_model import ROWS, build


def _tensors() -> list[torch.Tensor]:
    found = []
    for value in gc.get_objects():
        with contextlib.suppress(Exception):  # (objects that fail isinstance or storage access)
            if isinstance(value, torch.Tensor) and not value.is_meta:
                value.untyped_storage()
                found.append(value)
    return found


def _held(tensors: list[torch.Tensor]) -> int:
    storages = (tensor.untyped_storage() for tensor in tensors)
    return sum(
        {storage.data_ptr() or id(storage): storage.nbytes() for storage in storages}.values()
    )


def measured_step(strategy: str, options: dict | None, width: int) -> dict:
    """On one rank: the accounting model ``build(width)`` under ``strategy``, two steps, the second
    measured; returns ``{"held": bytes, "adds": {phase: bytes}}`` (phases as
    :data:`rankwise.tools.plan.fake_step.PHASES` numbers them)."""
    import rankwise
    from rankwise.tools.plan.fake_step import StepTracker

    with rankwise.setup(strategy, options=options, seed=0) as rt:
        model, optimizer = rt.prepare(*build(width))
        batch = torch.randn(ROWS, width)
        for step in range(2):
            tracker = StepTracker()
            held = 0
            if step == 1:
                gc.collect()
                before = _tensors()
                held = _held(before)
                tracker.known(before)
                del before
            with tracker if step == 1 else contextlib.nullcontext():
                loss = model(batch).float().square().mean()
                tracker.phase = 1
                rt.backward(loss, model)
                del loss
                tracker.phase = 2
                rt.step(optimizer, model)
            optimizer.zero_grad()
    adds: dict[int, int] = {}
    for sample in tracker.samples:
        now = sample.activations + sample.gradients + sample.optimizer_temporaries
        adds[sample.phase] = max(adds.get(sample.phase, 0), now)
    return {"held": held, "adds": adds}
