"""One optimizer step's time per rank: computation, the optimizer, and the communication computation
does not hide.

- Compute: the step's FLOPs (the trace's forward and backward passes, times the micro-batches) at
  the device's peak times a stated efficiency (:mod:`~rankwise.tools.plan.devices`), or, where the
  plan timed the captured model's real step on this machine under the strategy at one rank
  (:mod:`~rankwise.tools.plan.calibrate`), that time (the optimizer and the strategy's own work
  included); the efficiency is then what it implies.
- Optimizer: memory-bound: it reads the parameters, gradients and state and writes parameters and
  state once, at the device's memory bandwidth (or timed here); a strategy that shards the state
  updates its 1/N only.
- Communication (:mod:`~rankwise.tools.plan.comms`): every collective's alpha-beta time.  A
  collective the strategy runs beside a pass is hidden by that pass's compute time, except the last
  call of the backward pass's (its gradients are ready only when the pass ends); one the strategy
  runs apart (ZeRO-1/2) is not.  Where the device cannot compute and communicate at once (a CPU
  whose cores the ranks' threads all use), nothing is hidden, and each call costs what it was
  measured to cost between two computations where that was measured
  (:mod:`~rankwise.tools.plan.between`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rankwise.strategies import lookup
from rankwise.tools.plan.comms import Bandwidth, Collective
from rankwise.tools.plan.devices import Device
from rankwise.tools.plan.fake_step import Trace


@dataclass(frozen=True)
class Timed:
    """The captured model's optimizer step timed on this machine under a strategy at one rank
    (:mod:`~rankwise.tools.plan.calibrate`)."""

    step_s: float
    """Seconds of the whole step: every micro-batch's passes, the optimizer and the strategy's own
    work."""
    how: str
    """What was timed, in words."""
    spread: float = 0.0
    """The timed steps' interquartile range over their median: the timing's own noise."""


@dataclass
class StepTime:
    compute_s: float
    """Forward and backward passes of all the step's micro-batches."""
    optimizer_s: float
    """The optimizer step."""
    comm_s: float
    """Every collective of the step, end to end."""
    exposed_comm_s: float
    """The part of it the step waits for."""
    flops: int
    """One rank's FLOPs in the step."""
    efficiency: float
    """The step's FLOPs over the peak, over the compute time."""
    overlap: str
    """What hides what, in words."""
    noise: float = 0.0
    """The share of the step a repeat of its timing could move it by (the timed steps' spread;
    0 for a step from FLOPs and the bandwidth model)."""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.optimizer_s + self.exposed_comm_s


def optimizer_bytes(trace: Trace) -> int:
    """Bytes an optimizer step moves: parameters read and written, gradients read, state read and
    written."""
    return 2 * trace.param_bytes + trace.gradient_bytes + 2 * trace.optimizer_bytes


def step_time(
    strategy: str,
    trace: Trace,
    world: int,
    grad_accum: int,
    device: Device,
    half: bool,
    calls: list[Collective],
    bandwidth: Bandwidth,
    timed: Timed | None = None,
) -> StepTime:
    """The step time of ``strategy`` at ``world`` ranks (see the module's docstring); ``half``: the
    matrix products run at 16 bits (autocast, or a 16-bit engine)."""
    flops = trace.flops * grad_accum
    peak = device.peak(half)
    if timed is not None:
        compute, optimizer = timed.step_s, 0.0
    else:
        compute = flops / (peak * device.efficiency)
        optimizer = optimizer_bytes(trace) / device.memory_bandwidth
        facts = lookup(strategy).facts
        if facts is not None and "optimizer" in facts.shards:
            optimizer /= world  # the rank steps its 1/N of the state
    forward_share = trace.forward_flops / trace.flops if trace.flops else 1 / 3
    hiding = {"forward": compute * forward_share, "backward": compute * (1 - forward_share)}
    total_comm, exposed, beside = 0.0, 0.0, {"forward": 0.0, "backward": 0.0}
    last_backward = 0.0
    for call in calls:
        seconds = bandwidth.seconds(
            call.op, call.nbytes, call.calls, world, busy=not device.overlaps
        )
        total_comm += seconds
        if call.overlapped and device.overlaps:
            beside[call.overlapped] += seconds
            if call.overlapped == "backward":
                last_backward = max(last_backward, seconds / call.calls)
        else:
            exposed += seconds
    for phase, seconds in beside.items():
        exposed += max(0.0, seconds - hiding[phase])
    if beside["backward"] and beside["backward"] <= hiding["backward"]:
        exposed += last_backward
    if not calls:
        overlap = "no communication"
    elif not device.overlaps:
        overlap = "none: every core computes, so communication waits its turn"
    elif any(call.overlapped for call in calls):
        overlap = (
            ", ".join(
                sorted(
                    {
                        f"{call.what} beside the {call.overlapped} pass"
                        for call in calls
                        if call.overlapped
                    }
                )
            )
            + "; the last backward call exposed"
        )
        apart = [call.what for call in calls if not call.overlapped]
        if apart:
            overlap += "; not hidden: " + ", ".join(apart)
    else:
        overlap = "none: " + ", ".join(call.what for call in calls) + " after the backward pass"
    efficiency = flops / (peak * compute) if compute > 0 else 0.0
    noise = timed.spread * compute / (compute + optimizer + exposed) if timed and compute else 0.0
    return StepTime(compute, optimizer, total_comm, exposed, flops, efficiency, overlap, noise)
