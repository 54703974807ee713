"""A user's own training loop, written only on rankwise's public API, for every strategy.

Accumulation 2, clipping that fires every step, an LR schedule and AdamW state, a
checkpoint after step 3 written with ``rt.save_state``.  Three phases:

* ``full``: 6 optimizer steps without interruption (saving at step 3 on the way);
* ``first``: steps 1-3, save, stop;
* ``resume``: a fresh process group loads the step-3 checkpoint with ``rt.load_state``
  and takes steps 4-6.

Each returns (on rank 0) the final full weights and the gradient norm ``rt.step(...,
max_norm=...)`` reported at each step (``spelling="clip"``: the older ``rt.clip_grad_norm``
followed by ``rt.step``).  Runs in a test's rank pool, or as a script
under a launcher (horovodrun)::

    python -m tests.support.public_loop --strategy horovod --phase full --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import rankwise

STEPS = 6
SAVE_AT = 3
GRAD_ACCUM = 2
GLOBAL_BATCH = 16
MAX_NORM = 1e-4
"""Far below the gradient norms of this model: every step is clipped."""


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(11)
    features = torch.randn(256, 10, generator=generator)
    labels = torch.randint(0, 5, (256,), generator=generator)
    return TensorDataset(features, labels)


def train(
    strategy: str, out: str, phase: str, max_norm: float = MAX_NORM, spelling: str = "step"
) -> dict | None:
    """Run one phase; returns ``{"weights", "norms", "steps"}`` on rank 0, None elsewhere."""
    with rankwise.setup(strategy, seed=0) as rt:
        model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 5))
        # AdamW divides by the gradient's running RMS, so clipping changes its update through eps:
        # an eps comparable to the clipped gradients makes the clipping visible in the weights.
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01, eps=1e-6)
        micro = GLOBAL_BATCH // (GRAD_ACCUM * rt.world_size)
        model, optimizer = rt.prepare(
            model, optimizer, grad_accum=GRAD_ACCUM, micro_batch_size=micro
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 1.0 - step / (2 * STEPS)
        )
        loader = rt.loader(dataset(), GLOBAL_BATCH // GRAD_ACCUM, shuffle=True)
        checkpoints = Path(out) / "checkpoints"
        if phase == "resume":
            assert rt.load_state(checkpoints, model, optimizer, scheduler)["step"] == SAVE_AT
        norms = []
        last_step = SAVE_AT if phase == "first" else STEPS
        rt.set_epoch(loader, 0)
        # After load_state the loader continues where the checkpoint stood: no skip of the loop's
        # own.
        for _, last, (features, labels) in rankwise.iterate_steps(loader, GRAD_ACCUM):
            features, labels = rt.to_device((features, labels))
            # the backward pass too: that is where syncing happens
            with rt.no_sync(model, enabled=not last):
                with rt.autocast():
                    loss = nn.functional.cross_entropy(model(features), labels)
                rt.backward(loss / GRAD_ACCUM, model)
            if not last:
                continue
            if spelling == "clip":
                norms.append(float(rt.clip_grad_norm(model, optimizer, max_norm)))
                rt.step(optimizer, model)
            else:
                norms.append(float(rt.step(optimizer, model, max_norm=max_norm)))
            rt.zero_grad(optimizer)
            scheduler.step()
            if rt.steps == SAVE_AT and phase != "resume":
                rt.save_state(checkpoints, model, optimizer, scheduler, extra={"epoch": 0})
            if rt.steps == last_step:
                break
        weights = rt.state_dict(model)  # every rank calls: sharded strategies gather
        if not rt.is_main:
            return None
        return {"weights": weights, "norms": norms, "steps": rt.steps}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--phase", choices=["full", "first", "resume"], required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = train(args.strategy, args.out, args.phase)
    if result is not None:
        torch.save(result, Path(args.out) / f"result-{args.phase}.pt")


if __name__ == "__main__":
    main()
