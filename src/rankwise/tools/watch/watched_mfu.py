"""A watched benchmark's FLOP/s and MFU: torch's FLOP counter over the script's first optimizer step
(a warm-up step, outside the timed window), the matrix-product peak measured on every rank after the
window.

The count is the script's own forward and backward passes as they ran (``FlopCounterMode``: matrix
products, convolutions, attention), per sample of that step; a row's TFLOP/s is that times its
samples/s.  A model whose shapes change from step to step (text padded to each batch's longest) is
counted at its first batch's shapes, and the report says so.  A compiled model is not counted: the
counter does not see inside compiled graphs.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, TypedDict

import torch

from rankwise.measure.flops import datasheet_peak, matmul_peak

if TYPE_CHECKING:
    from torch.utils.flop_counter import FlopCounterMode


class StepFlops:
    """Counts this rank's FLOPs from its first training forward to its first optimizer step."""

    def __init__(self) -> None:
        self.mode: FlopCounterMode | None = None
        """The counter, from the first training forward to the first optimizer step."""
        self.flops: int | None = None
        """This rank's FLOPs in the counted step; ``None`` until counted (or where they could not
        be)."""
        self.dtype = torch.float32
        """The dtype the counted step's matrix products ran at (autocast's, or the parameters')."""
        self.skipped = ""

    def start(self, model: torch.nn.Module, device_type: str) -> None:
        """At the first forward with gradients on (from a forward pre-hook)."""
        if self.mode is not None or self.flops is not None or self.skipped:
            return
        if hasattr(model.forward, "_torchdynamo_orig_callable") or hasattr(model, "_orig_mod"):
            self.skipped = (
                "compiled model: torch's FLOP counter does not see inside compiled graphs"
            )
            return
        from torch.utils.flop_counter import FlopCounterMode

        try:
            if torch.is_autocast_enabled(device_type):
                self.dtype = torch.get_autocast_dtype(device_type)
        except (TypeError, RuntimeError, AttributeError):
            # an older torch without the per-device autocast queries: the parameters' dtype below
            pass
        half = {p.dtype for p in model.parameters() if p.dtype in (torch.float16, torch.bfloat16)}
        if self.dtype == torch.float32 and half:
            self.dtype = half.pop()
        self.mode = FlopCounterMode(display=False)
        self.mode.__enter__()

    def stop(self) -> None:
        """At the first optimizer step (its pre-hook): the forward and backward passes are done."""
        if self.mode is None:
            return
        mode, self.mode = self.mode, None
        try:
            mode.__exit__(None, None, None)
            self.flops = int(mode.get_total_flops())
        except Exception as e:
            # the count is a bonus: a script the counter cannot follow still runs and is timed
            self.skipped = f"not counted ({type(e).__name__}: {e})"
            warnings.warn(f"rankwise: FLOPs not counted ({type(e).__name__}: {e})", stacklevel=2)

    def peak(self, device: torch.device) -> float | None:
        """This rank's measured matrix-product peak at the counted dtype (call on every rank at
        once)."""
        if not self.flops:
            return None
        try:
            return matmul_peak(device, self.dtype)
        except (RuntimeError, MemoryError):
            return None  # no memory left for the product: no MFU, the row keeps its throughput


class Utilisation(TypedDict):
    """What ``probe.json`` says of a benchmark's FLOPs (``None`` throughout where a rank's count is
    missing)."""

    flops_per_sample: int | None
    """All ranks' FLOPs of the counted step over its global batch."""
    peak_flops_per_s: float | None
    """The ranks' measured matrix-product peaks, summed (``None``: a rank measured none)."""
    datasheet_flops_per_s: float | None
    """The ranks' datasheet peaks, summed (``None``: a GPU whose datasheet is unknown)."""


def utilisation(
    flops: list[int | None],
    samples: list[int],
    peaks: list[float | None],
    device: torch.device,
    dtype: torch.dtype,
    copies: int = 1,
) -> Utilisation:
    """``flops_per_sample`` (all ranks' FLOPs of the counted step over its global batch), the ranks'
    summed measured peak and datasheet peak (known GPUs), for the bench to turn samples/s into
    TFLOP/s and MFU. ``copies``: the ranks each value stands for (a script that left its group
    before the end: rank 0's alone)."""
    counted = [f for f in flops if f is not None]
    if len(counted) < len(flops) or not sum(samples) or not sum(counted):
        return {"flops_per_sample": None, "peak_flops_per_s": None, "datasheet_flops_per_s": None}
    sheet = datasheet_peak(device, dtype)
    known = [peak for peak in peaks if peak]
    return {
        "flops_per_sample": round(sum(counted) / sum(samples)),
        "peak_flops_per_s": sum(known) * copies if len(known) == len(peaks) else None,
        "datasheet_flops_per_s": sheet * len(flops) * copies if sheet else None,
    }
