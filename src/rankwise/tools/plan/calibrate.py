"""The captured model's real step timed on this machine, under each strategy, when the plan is for
this CPU.

A FLOP count at a stated efficiency says little about a small model on a CPU, where most of a step
is per-operation overhead and the strategy's own machinery (FSDP's and ZeRO-3's hooks around every
layer, ZeRO's flat copies) rather than arithmetic.  When ``--device cpu`` and the model fits
comfortably (its traced one-process peak under :data:`MAX_SHARE` of this machine's memory), the plan
builds a real copy (random weights, :func:`~rankwise.tools.plan.fake.real_copy`) and runs it in this
process under the strategy itself, at one rank (``rankwise.Runtime`` with a one-process group: the
same ``prepare`` / ``backward`` / ``step`` / ``zero_grad`` a script calls), on the micro-batch a
rank gets at the planned world size and with the threads it gets there (cores / ranks per node): the
median optimizer step after :data:`WARMUP`, over at least :data:`REPEATS` steps and more until their
spread is within :data:`STABLE` (or the budget is spent; the spread is reported).  What more ranks
add, the communication, is the bandwidth model's (:mod:`~rankwise.tools.plan.comms`).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import torch

from rankwise.tools.plan.capture import Capture, loss_of
from rankwise.tools.plan.fake import real_copy
from rankwise.tools.plan.fake_step import resized
from rankwise.tools.plan.timing import Timed

MAX_SHARE = 0.25
"""The largest share of this machine's memory a model the plan times for real may need."""
WARMUP = 2
REPEATS = 5
"""Steps timed at least, after the warm-up."""
STABLE = 0.05
"""Timings are stable when their interquartile range is within this share of their median: until
then more steps are timed (two identical plans of one script gave 39.1 and 89.7 ms for one row on a
busy machine, five steps each)."""
MAX_REPEATS = 25
MAX_TIMING_S = 20.0
"""...but no more than these steps and seconds a strategy; the spread left is reported, and rows
within it are ties (:meth:`~rankwise.tools.plan.planner.Plan.fastest`)."""


def spread(seconds: list[float]) -> float:
    """The interquartile range of ``seconds`` over their median."""
    if len(seconds) < 2:
        return 0.0
    low, _, high = statistics.quantiles(seconds, n=4, method="inclusive")
    median = statistics.median(seconds)
    return (high - low) / median if median > 0 else 0.0


def enough(seconds: list[float], elapsed_s: float) -> bool:
    """Whether the timed steps (after the warm-up) are enough: stable, or the budget spent."""
    if len(seconds) < REPEATS:
        return False
    return spread(seconds) <= STABLE or len(seconds) >= MAX_REPEATS or elapsed_s >= MAX_TIMING_S


def allocate_as_a_rank_does(gathers_layers: bool) -> None:
    """This process's glibc allocates as a launched rank of the strategy does: a strategy that
    gathers and frees whole layers fixes the mmap threshold at 1 MiB
    (:func:`rankwise.process.fix_mmap_threshold`), so each block of 1 MiB or more is mapped and
    zeroed anew, which made the built-in model's step 60 % longer (204 ms against 125 ms, one
    thread); any other keeps glibc's moving threshold, which a rank's steady steps push up to its
    ceiling.  mallopt cannot give the moving threshold back once fixed, so another strategy timed
    here before must not leave its setting behind: the ceiling stands in for it.  Timed otherwise,
    the plan would predict a step no launched rank takes.  (Linux's glibc only; elsewhere nothing
    changes.)"""
    from rankwise.process import MMAP_THRESHOLD_BYTES, MMAP_THRESHOLD_MAX, fix_mmap_threshold

    fix_mmap_threshold(MMAP_THRESHOLD_BYTES if gathers_layers else MMAP_THRESHOLD_MAX)


def timed_step(
    capture: Capture,
    strategy: str,
    precision: str,
    rows: int,
    threads: int,
    checkpointing: bool = False,
) -> Timed:
    """Time ``strategy``'s optimizer step at one rank on ``rows`` samples a micro-batch, with
    ``threads`` threads (``checkpointing``: the layers recompute their activations)."""
    from rankwise.process import ProcessEnv
    from rankwise.runtime import Runtime

    accumulation = capture.grad_accum
    args, kwargs = resized(capture, rows)
    # (init_process_group wraps the hook every time)
    before, hook = torch.get_num_threads(), sys.excepthook
    torch.set_num_threads(threads)
    seconds: list[float] = []
    try:
        # (DeepSpeed calls torch's deprecated collectives on every step: one FutureWarning each,
        # nothing to act on)
        with (
            warnings.catch_warnings(),
            Runtime(strategy, precision, seed=0, env=ProcessEnv()) as rt,
        ):
            warnings.simplefilter("ignore", FutureWarning)
            allocate_as_a_rank_does(rt.strategy.gathers_layers)
            model, optimizer = real_copy(capture.model, capture.optimizer)
            model, optimizer = rt.prepare(
                model,
                optimizer,
                grad_accum=accumulation,
                micro_batch_size=rows,
                activation_checkpointing=checkpointing,
            )
            model.train()
            began = time.perf_counter()
            while not enough(seconds[WARMUP:], time.perf_counter() - began):
                start = time.perf_counter()
                for micro in range(accumulation):
                    with rt.no_sync(model, enabled=micro < accumulation - 1):
                        with (
                            rt.autocast()
                            if capture.autocast
                            else torch.autocast("cpu", enabled=False)
                        ):
                            loss = loss_of(model(*args, **kwargs))
                        rt.backward(loss / accumulation, model)
                rt.step(optimizer, model)
                rt.zero_grad(optimizer)
                seconds.append(time.perf_counter() - start)
            del model, optimizer, loss
    finally:
        torch.set_num_threads(before)
        sys.excepthook = hook
    timed = seconds[WARMUP:]
    noise = spread(timed)
    return Timed(
        statistics.median(timed),
        f"{strategy}'s step timed here at one rank ({rows} rows, {threads} thread(s)): the median "
        f"of {len(timed)} steps, interquartile spread {noise:.0%}",
        noise,
    )
