"""torch: ``Module.compile`` runs a module whose ``forward`` is torch's own code eagerly,
silently."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.compat.versions import Workaround

COMPILE_THROUGH_A_TRACED_FRAME = Workaround(
    name="rankwise.compat.torch_compile.compile_forward",
    library="torch",
    upstream="https://github.com/pytorch/pytorch/issues/150915",
    seen_on=("2.13",),
)


def compile_forward(model: nn.Module, **options) -> None:
    """``torch.compile`` ``model.forward`` in place (``options``: ``torch.compile``'s), so parameter
    names and checkpoints do not change.

    Not ``Module.compile``: it compiles ``Module._call_impl``, which Dynamo skips as torch's own
    code, so a model whose ``forward`` is torch's too (``nn.Sequential``) ran eagerly, silently
    (pytorch#150915).  Here the compiled frame is a function of ours that calls the bound
    ``forward`` (an instance's own, a wrapper's, is kept).  It also leaves the module's hooks
    outside the graph, where FSDP's would break it before the forward begins: so before giving the
    record a ``fixed_in``, check FSDP's and DeepSpeed's compiled runs on that release too (the
    fallback ``Module.compile`` puts the hooks back in the graph)."""
    if not COMPILE_THROUGH_A_TRACED_FRAME.applies():
        model.compile(**options)
        return
    forward = model.forward

    def call(*args, **kwargs):
        return forward(*args, **kwargs)

    model.forward = torch.compile(call, **options)
