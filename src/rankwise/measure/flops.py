"""Achieved FLOP/s and model FLOPs utilisation (MFU).

FLOPs are counted by torch's own counter (``torch.utils.flop_counter.FlopCounterMode``) over one
forward and backward pass, on a *fake* copy of the model (``FakeTensorMode``: shapes only, so no
memory, no compute and no random numbers drawn).  They are model FLOPs: what the pass needs, not
what activation checkpointing recomputes.  Text batches are padded to their own longest, so their
FLOPs depend on the padded length L; a transformer's are ``a + b*L + c*L**2`` per sample (matrix
products grow with L, attention with L squared), so :class:`LengthFlops` counts three lengths, fits
that exactly and checks the fit on a fourth length before using it.

The peak MFU divides by is measured in the same run (:func:`matmul_peak`: a dense matrix product at
the run's dtype on the run's device) and, for known GPUs, read from the datasheet
(:func:`datasheet_peak`).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections import Counter
from collections.abc import Callable

import torch
from torch import nn

from rankwise.compat.flop_formulas import cpu_attention
from rankwise.compat.torch_dispatch import TorchDispatchMode
from rankwise.logs import get_logger

log = get_logger(__name__)

Batch = dict
Forward = Callable[[nn.Module, Batch], torch.Tensor]


def _signature(batch: Batch) -> tuple:
    return tuple(
        (key, tuple(value.shape), value.dtype)
        for key, value in sorted(batch.items())
        if isinstance(value, torch.Tensor)
    )


class FlopCounter:
    """FLOPs of one forward and backward pass over a batch, counted once per distinct set of input
    shapes."""

    def __init__(
        self,
        model: nn.Module,
        forward: Forward,
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ):
        """``model``: the unwrapped model, before a strategy shards it (its parameters' full
        shapes); ``forward(model, batch)``: the logits the training loop computes; ``autocast``:
        the context the loop runs its forward in (the precision's), so the counted pass computes at
        the dtypes the real one does."""
        from rankwise.compat.fake_tensor import FakeTensorMode

        self.mode = FakeTensorMode()
        self.forward = forward
        self.autocast = autocast
        self.dtypes: Counter[torch.dtype] = Counter()
        """The counted passes' matrix-product FLOPs by the dtype they ran at (what MFU's peak is
        measured at: :attr:`dtype`)."""
        # A copy whose parameters and buffers are fake: the real model is neither copied nor
        # touched.
        memo: dict[int, torch.Tensor] = {
            id(p): nn.Parameter(self.mode.from_tensor(p.detach()), p.requires_grad)
            for p in model.parameters()
        }
        memo.update({id(b): self.mode.from_tensor(b) for b in model.buffers()})
        self.model = copy.deepcopy(model, memo)
        self.cache: dict[tuple, int] = {}

    def count(self, batch: Batch) -> int:
        key = _signature(batch)
        if key not in self.cache:
            self.cache[key] = self._count(batch)
        return self.cache[key]

    def _count(self, batch: Batch) -> int:
        from torch.utils.flop_counter import FlopCounterMode

        params = [p for p in self.model.parameters() if p.requires_grad]
        with self.mode:
            fake = {
                k: self.mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                for k, v in batch.items()
            }
            # (the CPU's fused attention counted as torch counts the GPU's: compat.flop_formulas)
            counter = FlopCounterMode(display=False, custom_mapping=cpu_attention())
            with counter, MatmulDtypes() as seen:
                with self.autocast():
                    loss = self.forward(self.model, fake).float().sum()
                # The gradients the backward pass computes, without writing any .grad.
                torch.autograd.grad(loss, params, allow_unused=True)
        self.dtypes.update(seen.flops)
        return counter.get_total_flops()

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype most of the counted matrix-product FLOPs ran at (None: nothing counted)."""
        return self.dtypes.most_common(1)[0][0] if self.dtypes else None


MATMULS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward")
"""The aten ops whose dtype says at which rate a step's matrix products run."""


class MatmulDtypes(TorchDispatchMode):
    """Records the dtype each matrix product runs at, weighted by its multiply-adds (fake tensors:
    shapes only).  torch's FLOP counter counts FLOPs but not their dtype; MFU needs both."""

    def __init__(self):
        super().__init__()
        self.flops: Counter[torch.dtype] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in MATMULS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            result = out[0] if isinstance(out, tuple) else out
            if tensors and isinstance(result, torch.Tensor):
                # output elements x the reduced dimension: proportional to the product's FLOPs
                inner = tensors[-1].shape[-2] if tensors[-1].ndim >= 2 else 1
                self.flops[tensors[0].dtype] += result.numel() * inner
        return out


def padded_length(batch: Batch) -> int | None:
    """A text batch's padded length (dimension 1 of ``input_ids``); None for inputs without one."""
    ids = batch.get("input_ids")
    return int(ids.shape[1]) if isinstance(ids, torch.Tensor) and ids.ndim == 2 else None


def rows(batch: Batch) -> int:
    return next(
        int(v.shape[0]) for v in batch.values() if isinstance(v, torch.Tensor) and v.ndim >= 1
    )


def fake_counter(
    model: nn.Module,
    forward: Forward,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> FlopCounter | None:
    """A :class:`FlopCounter` for ``model``, or None where it cannot be faked: FLOPs are a report,
    never a reason for a run to fail (said at debug level only: nothing the user can change makes
    torch's fake tensors copy it)."""
    try:
        return FlopCounter(model, forward, autocast)
    except Exception as e:  # noqa: BLE001 - any model torch's fake tensors cannot copy
        log.debug(
            f"FLOPs will not be counted: the model could not be copied onto fake tensors ({e})",
            every_rank=True,
        )
        return None


def devices(model: nn.Module) -> int:
    """The devices one rank computes on: DataParallel's GPUs, or those a model is split over (else
    1)."""
    if isinstance(model, nn.DataParallel):
        return len(model.device_ids) or 1  # no GPU: it runs the module on the CPU
    return len({p.device for p in model.parameters()}) or 1


def with_length(batch: Batch, length: int | None, rows: int) -> Batch:
    """``batch`` with ``rows`` samples and every tensor of its padded length at ``length`` instead
    (``None``: no length to change); values are zeros (only shapes are counted)."""
    old = padded_length(batch)
    resized = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            shape = [rows, *value.shape[1:]]
            if length is not None and value.ndim >= 2 and value.shape[1] == old:
                shape[1] = length
            value = torch.zeros(shape, dtype=value.dtype)
        resized[key] = value
    return resized


MAX_SHAPES = 64
"""Distinct batch shapes counted one by one at most, where the length fit does not hold (each is a
traced pass)."""


class LengthFlops:
    """FLOPs of many batches that differ in rows and padded length, from few counts: per sample a
    quadratic in the padded length, fitted on three counted lengths and used only when a fourth
    count agrees."""

    def __init__(self, counter: FlopCounter, template: Batch):
        self.counter, self.template = counter, template
        self.fitted: tuple[float, float, float] | None = None
        """The per-sample quadratic's coefficients, once a fourth count confirmed it; else every
        shape is counted."""

    def per_sample(self, length: int | None) -> float:
        return self.counter.count(with_length(self.template, length, rows=1))

    def total(self, shapes: Counter) -> int:
        """Total FLOPs of batches given as ``Counter({(rows, padded length or None): how
        many})``."""
        lengths = sorted({length for _, length in shapes if length is not None})
        if len(lengths) > 4 and not self._fit(lengths) and len(shapes) > MAX_SHAPES:
            raise ValueError(
                f"the FLOPs are not quadratic in the padded length, and {len(shapes)} batch shapes "
                f"are too many to count one by one (at most {MAX_SHAPES})"
            )
        if len(lengths) <= 4 or not self.fitted:
            return sum(
                self.counter.count(with_length(self.template, n, rows)) * times
                for (rows, n), times in shapes.items()
            )
        a, b, c = self.fitted
        return round(
            sum(rows * (a + b * n + c * n * n) * times for (rows, n), times in shapes.items())
        )

    def _fit(self, lengths: list[int]) -> bool:
        import numpy as np

        chosen = [lengths[0], lengths[len(lengths) // 2], lengths[-1]]
        counts = [self.per_sample(n) for n in chosen]
        c, b, a = np.polyfit(chosen, counts, 2)
        check = lengths[len(lengths) // 4]
        predicted, counted = a + b * check + c * check * check, self.per_sample(check)
        if abs(predicted - counted) > 1e-6 * max(counted, 1):
            return False
        self.fitted = (float(a), float(b), float(c))
        return True


PEAK_SIZES = {"cuda": (4096, 8192), "cpu": (512, 1024)}
"""Square matrix sizes the peak is measured at, per device type: the best of them is the peak."""


def matmul_peak(device: torch.device, dtype: torch.dtype, seconds: float = 0.2) -> float:
    """FLOP/s of the best of repeated square matrix products at ``dtype`` on ``device``, over
    :data:`PEAK_SIZES`: the most this process can compute here, measured (the rate a step's matrix
    products could at best reach)."""
    best = 0.0
    for size in PEAK_SIZES.get(device.type, PEAK_SIZES["cuda"]):
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        fastest = float("inf")
        deadline = time.perf_counter() + seconds / 2
        torch.matmul(a, b)  # first call: kernel selection, allocation
        while time.perf_counter() < deadline or fastest == float("inf"):
            _sync(device)
            start = time.perf_counter()
            for _ in range(4):
                torch.matmul(a, b)
            _sync(device)
            fastest = min(fastest, (time.perf_counter() - start) / 4)
        best = max(best, 2 * size**3 / fastest)
        del a, b
    return best


def mfu(achieved: float, peak: float | None) -> float | None:
    """``achieved`` FLOP/s over ``peak``, or None where the peak was not measured or is no peak: a
    step that computed faster than the "peak" measured beside it shows the measurement missed the
    rate this device reaches (another kernel, another dtype), and an MFU above 100 % says
    nothing."""
    if not peak or achieved > peak:
        return None
    return achieved / peak


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Dense (no sparsity) peak TFLOP/s from NVIDIA's datasheets: fp32 without tensor cores, and
# bf16/fp16 tensor cores.
DATASHEET_TFLOPS = {
    "H200": {"fp32": 67.0, "16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "16": 756.0},
    "H100 NVL": {"fp32": 60.0, "16": 835.0},
    # SXM5 (the "H100 80GB HBM3" of torch.cuda.get_device_name)
    "H100": {"fp32": 66.9, "16": 989.4},
    "A100": {"fp32": 19.5, "16": 312.0},
    "L40S": {"fp32": 91.6, "16": 362.1},
    "L40": {"fp32": 90.5, "16": 181.0},
    "L4": {"fp32": 30.3, "16": 121.0},
    "V100": {"fp32": 15.7, "16": 125.0},
}


def datasheet_peak(device: torch.device, dtype: torch.dtype) -> float | None:
    """The datasheet's peak FLOP/s for this GPU at ``dtype``, else None: a CPU, an unknown GPU, bf16
    on a V100, or fp32 where torch lets matrix products use TF32 (whose peak is neither fp32's nor
    listed here)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    # the longer names first where one contains another
    for model, peaks in DATASHEET_TFLOPS.items():
        if model in name:
            if dtype == torch.float32:
                if torch.backends.cuda.matmul.allow_tf32:
                    return None  # TF32's peak is not the fp32 one, nor listed here
                return peaks["fp32"] * 1e12
            if dtype == torch.bfloat16 and model == "V100":
                return None  # no bf16 tensor cores
            return peaks["16"] * 1e12
    return None
