"""Whether a loss is a sum over its batch: read from its autograd graph as backward is called.

Data parallelism averages the ranks' gradients, so it computes one process's step only where each
rank's loss is a mean over its share of the batch: a loss summed over the batch (``out.sum()``, a
criterion with ``reduction="sum"``) gives N ranks 1/N of the gradient one process sums over the
same global batch.  The loss's last operations say it: a ``SumBackward0`` over the batch's rows, or
a loss function that saved ``reduction=sum``, under nothing but constant factors of 1 (Lightning
divides by its ``accumulate_grad_batches``).  Any other factor is a normalisation the script chose
(a token count, the world size) and is not judged here: verify's lockstep judges it.
"""

from __future__ import annotations

import ctypes
import struct

import torch

from rankwise.compat.autograd_saved import saved

SUM = 2
"""``torch.nn._reduction``'s code for ``reduction="sum"`` (``none`` 0, ``mean`` 1)."""
SCALINGS = {"MulBackward0": 1, "DivBackward0": -1}
"""A product or quotient, and the power its constant enters the factor at."""


def summed_over_batch(loss: torch.Tensor, samples: int | None) -> str | None:
    """How ``loss`` sums over its batch (``samples`` rows, where a DataLoader's batch fed it; None:
    unknown), or None where it does not, or where something else scales it."""
    node, factor = loss.grad_fn, 1.0
    while node is not None and type(node).__name__ in SCALINGS:
        other = saved(node, "other")
        inputs: list = [next_node for next_node, _ in node.next_functions]
        if not (
            isinstance(other, torch.Tensor)
            and other.numel() == 1
            and len(inputs) == 2
            and inputs[1] is None  # (the constant: no graph behind it)
        ):
            return None
        value = _constant(other)
        if value is None:
            return None
        factor *= value ** SCALINGS[type(node).__name__]
        node = inputs[0]
    if node is None or abs(factor - 1.0) > 1e-12:
        return None
    name = type(node).__name__
    if name == "SumBackward0":
        found = saved(node, "self_sym_sizes")
        sizes = tuple(int(s) for s in found) if isinstance(found, tuple | list) else ()
        rows = sizes[0] if sizes else 1
        over_the_batch = rows == samples if samples else len(sizes) >= 2
        if rows > 1 and over_the_batch:
            return f".sum() of a {sizes} tensor, its first dimension the batch"
        return None
    if saved(node, "reduction") == SUM:
        summed = saved(node, "self")
        if isinstance(summed, torch.Tensor) and summed.dim() > 0 and summed.shape[0] > 1:
            criterion = name.removesuffix("Backward0")
            return f'{criterion} with reduction="sum" over {summed.shape[0]} rows'
    return None


def _constant(tensor: torch.Tensor) -> float | None:
    """A constant factor's value, read from its memory without dispatching an op (the first step's
    FLOP count runs under a dispatch mode, which hands a Python number's tensor to ``item`` as the
    number itself, and ``item`` fails); None where it is no plain CPU number (a fake tensor, a
    device's, a 16-bit one)."""
    code = _FORMATS.get(tensor.dtype)
    if code is None or tensor.requires_grad or tensor.device.type != "cpu" or tensor.numel() != 1:
        return None
    try:
        address = tensor.data_ptr()
    except RuntimeError:  # (a fake tensor has no memory)
        return None
    if not address:
        return None
    return float(struct.unpack(code, ctypes.string_at(address, struct.calcsize(code)))[0])


_FORMATS = {
    torch.float64: "d",
    torch.float32: "f",
    torch.int64: "q",
    torch.int32: "i",
}
"""``struct``'s code for each dtype a constant factor comes in (Python numbers: int64, float64)."""
