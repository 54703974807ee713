"""torch: FLOP formulas for the CPU's fused attention, which ``FlopCounterMode`` counts as nothing.

``torch.utils.flop_counter`` registers formulas for the GPU's attention kernels (flash, efficient,
cuDNN) but not for the kernel ``scaled_dot_product_attention`` dispatches to on a CPU,
``aten._scaled_dot_product_flash_attention_for_cpu`` (a private op) and its backward: on a CPU, and
on the fake CPU tensors ``rankwise plan`` traces with, attention costs 0 FLOPs (22 % of Llama 3 8B's
step at 8,192 tokens).  :func:`cpu_attention` gives the two to
``FlopCounterMode(custom_mapping=...)`` with the formulas torch uses for the GPU's flash kernel
(``sdpa_flop_count``, ``sdpa_backward_flop_count``: causal masking not discounted, as torch counts
on a GPU), so a CPU count equals what the same step counts on a GPU.
``tests/compat/test_flop_formulas.py`` checks the count on the installed torch against SDPA's math
path, which is plain matrix products.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rankwise.compat.versions import Private

SEEN_ON = ("2.13",)
"""torch release series it was checked on."""

FORWARD = "_scaled_dot_product_flash_attention_for_cpu"
BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"


def _shape(tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def _forward(query, key, value, *args, out_val=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(_shape(query), _shape(key), _shape(value))


def _backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(_shape(grad_out), _shape(query), _shape(key), _shape(value))


def cpu_attention() -> dict[object, Callable[..., int]]:
    """``custom_mapping`` for ``FlopCounterMode``: the CPU's fused attention and its backward, as
    raw formulas (given the tensors; the ops that this torch lacks are left out)."""
    mapping: dict[object, Callable[..., int]] = {}
    formulas: tuple[tuple[str, Any], ...] = ((FORWARD, _forward), (BACKWARD, _backward))
    for name, formula in formulas:
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            # (FlopCounterMode calls a formula marked raw with the tensors, not their shapes)
            formula._get_raw = True
            mapping[op] = formula
    return mapping


MODULE_TRACKER = Private(
    "torch.utils.flop_counter.FlopCounterMode.mod_tracker",
    "torch",
    "its ModuleTracker hooks every module's outputs until their gradients arrive; under activation "
    "checkpointing the recomputed layers' outputs never get one, so they stayed alive through the "
    "backward pass (a traced checkpointed step 37 % above torch's MemTracker); a total needs no "
    "module breakdown, so the counter keeps only its 'Global' entry",
    SEEN_ON,
    on_instance=True,
)


class _GlobalOnly:
    """A module tracker that tracks nothing: every count goes to ``Global``, the total."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _GlobalOnly:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def total_counter() -> Any:
    """A ``FlopCounterMode`` that counts the total only (no display, no module breakdown), with the
    CPU's attention (:func:`cpu_attention`): nothing it does keeps a tensor alive."""
    from torch.utils.flop_counter import FlopCounterMode

    MODULE_TRACKER.check()
    counter = FlopCounterMode(display=False, custom_mapping=cpu_attention())
    # (the attribute is typed as torch's ModuleTracker; the stand-in has what the counter uses)
    counter.mod_tracker = _GlobalOnly()  # type: ignore[assignment]
    return counter
