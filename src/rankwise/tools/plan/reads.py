"""Values a model reads from its own tensors while the plan measures it on fake tensors, answered
with a stand-in.

A fake tensor has shapes and no values, so a forward that reads one fails on fake tensors: torch's
``nn.Transformer`` compares the mask it is given with a causal one (``_detect_is_causal_mask``:
``torch.equal``), and under the fake mode of FSDP's memory measurement
(:mod:`rankwise.tools.plan.fsdp_fake_ranks`) a mask the model builds is fake too (Lightning's demo
Transformer, Fabric's language-model example).  The measurement first runs as it is; only where a
value read fails (``DataDependentOutputException``) does it run again under :class:`ValueReads`, a
dispatch mode that answers each read with 0 (``False``, ``0``, ``0.0`` by dtype): a branch on such a
value takes its false side, and the plan says how many it answered.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from rankwise.compat.fake_tensor import READ, DataDependentOutputException, is_fake
from rankwise.compat.torch_dispatch import TorchDispatchMode

__all__ = ["DataDependentOutputException", "ValueReads"]


class ValueReads(TorchDispatchMode):
    """Answers a fake tensor's value read with 0 of its dtype; counts them (``answered``)."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: Collection[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        if func is READ and args and is_fake(args[0]):
            self.answered += 1
            dtype = args[0].dtype
            if dtype == torch.bool:
                return False
            return 0.0 if dtype.is_floating_point or dtype.is_complex else 0
        return func(*args, **(kwargs or {}))
