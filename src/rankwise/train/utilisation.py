"""The summary's FLOP/s and MFU: the steady steps' model FLOPs over their time, against the peak
measured here."""

from __future__ import annotations

import math

import torch

from rankwise.logs import get_logger
from rankwise.measure.flops import FlopCounter, LengthFlops, datasheet_peak, matmul_peak, mfu
from rankwise.measure.throughput import SteadyThroughput
from rankwise.runtime import Runtime

log = get_logger(__name__)

TERA = 1e12


def _tera(flops_per_s: float) -> float:
    # four significant figures: a CPU rank does hundredths of a TFLOP/s
    return float(f"{flops_per_s / TERA:.4g}")


def utilisation(
    rt: Runtime,
    counter: FlopCounter | None,
    template: dict | None,
    throughput: SteadyThroughput,
    devices: int = 1,
) -> dict:
    """``flops_per_sample``, ``tflops_per_s`` (all ranks), ``tflops_per_s_per_rank``, the measured
    peak of all ranks, ``mfu`` against it and ``mfu_datasheet`` (known GPUs); None where no step was
    steady (a collective). ``devices``: the devices each rank computes on (DataParallel's GPUs, a
    model split over two): the peaks are one device's times that."""
    mine: float
    try:
        mine = (
            LengthFlops(counter, template).total(throughput.shapes)
            if counter and template and throughput.steps
            else 0
        )
    except Exception as e:
        # a model torch's counter cannot trace on fake tensors: no FLOP/s, the run goes on
        # Debug only: the summary's FLOP/s are None, and nothing the user changes makes the counter
        # trace it.
        log.debug(f"rank {rt.rank}: FLOPs not counted ({type(e).__name__}: {e})", every_rank=True)
        mine = math.nan  # the sum below is then nan on every rank
    # the peak of the dtype the matrix products actually ran at (autocast's, as counted), not the
    # precision's name for it
    dtype = (counter.dtype if counter else None) or rt.strategy.precision.dtype
    peak = 0.0
    if throughput.steps:  # the same count on every rank: all of them measure, or none
        # Why: every rank measures its matrix-product peak at once, sharing the machine as its
        # training did.
        rt.barrier()
        try:
            peak = matmul_peak(rt.device, dtype) * devices
        except (RuntimeError, MemoryError) as e:
            # no memory left for the product: no MFU, the run's result stays
            log.debug(
                f"rank {rt.rank}: the matrix-product peak was not measured ({e})", every_rank=True
            )
            peak = math.nan
    flops, peaks, seconds = rt.all_reduce(
        torch.tensor([mine, peak, throughput.seconds], dtype=torch.float64, device=rt.device), "sum"
    ).tolist()
    seconds /= rt.world_size  # every rank timed the same steps
    # the global batch of each steady step (the same count on every rank)
    samples = throughput.samples
    if math.isnan(flops) or math.isnan(peaks) or not flops or seconds <= 0 or not samples:
        return {
            "flops_per_sample": None,
            "tflops_per_s": None,
            "tflops_per_s_per_rank": None,
            "peak_tflops_per_s": None if math.isnan(peaks) else _tera(peaks) or None,
            "mfu": None,
            "mfu_datasheet": None,
        }
    achieved = flops / seconds
    sheet = datasheet_peak(rt.device, dtype)
    measured = mfu(achieved, peaks)
    if measured is None and rt.rank == 0:
        log.info(
            f"MFU not given: the steps computed {_tera(achieved):.4g} TFLOP/s, above the "
            f"{_tera(peaks):.4g} TFLOP/s matrix-product peak measured here at {dtype}: that "
            "measurement missed this device's rate, so no share of it is meaningful"
        )
    return {
        "flops_per_sample": round(flops / samples),
        "tflops_per_s": _tera(achieved),
        "tflops_per_s_per_rank": _tera(achieved / rt.world_size),
        "peak_tflops_per_s": _tera(peaks),
        "peak_dtype": str(dtype).removeprefix("torch."),
        "mfu": None if measured is None else round(measured, 4),
        "mfu_datasheet": round(achieved / (sheet * devices * rt.world_size), 4) if sheet else None,
    }
