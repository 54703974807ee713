"""rankwise: one PyTorch training loop on every data-parallel strategy.

Public API for your own loop (see :mod:`rankwise.runtime` for a full example)::

    rt = rankwise.setup(strategy="ddp")          # joins the process group when launched
    model, optimizer = rt.prepare(model, optimizer)
    loader = rt.loader(dataset, batch_size=64)   # global batch, DistributedSampler inside
    rt.backward(loss, model); rt.step(optimizer, model)
    rt.all_reduce(t, "mean"); rt.gather_exact(index, preds, total=len(dataset))
    rt.save_weights(model, "model.safetensors"); rt.teardown()

Start it with ``rankwise launch --nproc-per-node N script.py`` or :func:`spawn`.
"""

from rankwise.env import ProcessEnv
from rankwise.launch.spawn import spawn
from rankwise.runtime import Runtime, iterate_steps, seed_everything, setup
from rankwise.strategies import Strategy, register, strategy_names

__all__ = ["ProcessEnv", "Runtime", "Strategy", "iterate_steps", "register", "seed_everything", "setup", "spawn",
           "strategy_names"]
__version__ = "0.1.0"
