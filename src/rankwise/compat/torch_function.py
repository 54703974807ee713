"""torch: ``torch._C.DisableTorchFunctionSubclass``, a torch function run on a tensor subclass as
on a plain tensor.

A tensor subclass that only watches what is done to it (``rankwise.tools.watch.gathered``: the rows
a script cuts off what it gathered) runs each function inside this context, so its results are
plain tensors and the watching does not spread to them.  torch's "Extending torch" guide and
``Tensor.__torch_function__`` itself use it; no public module exports it.
``tests/compat/test_torch_function.py`` shows on the installed torch that a function run inside it
returns a plain tensor.
"""

from __future__ import annotations

from torch._C import DisableTorchFunctionSubclass

SEEN_ON = ("2.11", "2.13")
"""torch release series it was used on (the CPU machines' 2.13, the GPU pass's 2.11)."""

__all__ = ["SEEN_ON", "DisableTorchFunctionSubclass"]
