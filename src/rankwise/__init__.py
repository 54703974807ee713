"""rankwise: one PyTorch training loop on every data-parallel strategy.

Public API for your own loop (see :mod:`rankwise.runtime` for a full example)::

    rt = rankwise.setup(strategy="ddp")          # joins the process group when launched
    model, optimizer = rt.prepare(model, optimizer, grad_accum=1)
    loader = rt.loader(dataset, batch_size=64)   # global batch, DistributedSampler inside
    rt.backward(loss, model); norm = rt.step(optimizer, model, max_norm=1.0)   # clip + step
    rt.save_state("ckpt", model, optimizer, scheduler)
    rt.load_state("ckpt", model, optimizer, scheduler)
    gather = rt.eval_gatherer(len(eval_set)); ...; index, preds = gather.result()
    rt.all_reduce(t, "mean"); rt.save_weights(model, "model.safetensors"); rt.teardown()

Start it with ``rankwise launch --nproc-per-node N script.py`` or :func:`spawn`.
"""

from typing import TYPE_CHECKING

from rankwise.process import ProcessEnv
from rankwise.runtime import Runtime, seed_everything, setup
from rankwise.sampling.batching import iterate_steps
from rankwise.strategies import Strategy, register, register_variant, strategy_names

if TYPE_CHECKING:
    from rankwise.launch.spawn import spawn


def __getattr__(name: str):
    # A rank started by a launcher never calls spawn: it loads (with the launchers' validated
    # configuration) on use.
    if name == "spawn":
        from rankwise.launch.spawn import spawn

        return spawn
    raise AttributeError(f"module 'rankwise' has no attribute {name!r}")


__all__ = [
    "ProcessEnv",
    "Runtime",
    "Strategy",
    "iterate_steps",
    "register",
    "register_variant",
    "seed_everything",
    "setup",
    "spawn",
    "strategy_names",
]
__version__ = "0.1.0"
