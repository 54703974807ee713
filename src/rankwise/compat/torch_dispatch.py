"""torch: ``TorchDispatchMode``, the one way to see every aten op a pass runs with its dtypes.

It lives in the private ``torch.utils._python_dispatch`` (torch's own FLOP counter, fake tensors and
memory tracker are built on it; no public module exports it).  rankwise's FLOP counting subclasses
it to record the dtype each matrix product runs at (``rankwise.measure.flops.MatmulDtypes``), which
MFU's peak is measured at.  ``tests/compat/test_torch_dispatch.py`` shows on the installed torch
that a subclass sees a fake pass's ``mm`` at autocast's dtype.
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rankwise.compat.versions import Private

SEEN_ON = ("2.11", "2.13")
"""torch release series it was used on (the CPU machines' 2.13, the GPU pass's 2.11)."""

DISPATCH_MODE = Private(
    "torch.utils._python_dispatch.TorchDispatchMode",
    "torch",
    "every aten op a pass runs, with its dtypes and its tensors (FLOP dtypes, the plan's memory "
    "trace); no public module exports it",
    SEEN_ON,
)
TREE_FLATTEN = Private(
    "torch.utils._pytree.tree_flatten",
    "torch",
    "the tensors in an op's nested arguments, as torch's own modes find them",
    SEEN_ON,
)

__all__ = ["SEEN_ON", "TorchDispatchMode", "tree_flatten"]
