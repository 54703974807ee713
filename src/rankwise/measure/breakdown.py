"""A training step's time split into its parts, read from torch's profiler: why a ``rankwise bench``
row is slow.

A few steps between a benchmark's warm-up and its timed window are profiled (:class:`StepProfile`;
the profiler's cost stays off the throughput).  rankwise marks each step and its regions with
``record_function`` (``rankwise#step``, ``#forward``, ``#backward``, ``#optimizer``, ``#sync SITE``
around the script's own collectives and ``.item()`` reads, ``#exchange`` around a framework's wait
for the gradient exchange outside backward); torch names the rest itself: the DataLoader's
``enumerate(DataLoader)#...`` (waiting for the next batch), the optimizer's ``Optimizer.step#...``,
autograd's ``autograd::engine::evaluate_function: ...`` (backward compute), c10d's collectives.  Per
step and rank (:data:`PARTS`, milliseconds): forward, backward and optimizer compute; communication
compute did not hide; waiting for the next batch; host syncs; waiting for the slowest rank; the
remainder, stated as such.

Waiting for the slowest rank comes from arrival times (:func:`combine`), each counted from the start
of the rank's own step (when the previous exchange let it go): at the gradient exchange a rank
arrives when its backward compute ends, at each of the script's collectives when it calls it.  What
a rank waited there for the last rank's later arrival is waiting for the slowest rank; the rest,
communication (including an exchange that let the ranks go at different times).  The profiled steps
start together, after a barrier.  On a GPU the regions are the host's view (kernels are queued, not
timed), which the report says.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.profiler import record_function

from rankwise.measure.records import ModelFacts, RankParts
from rankwise.measure.window_steps import data_excess, paused

MARK = "rankwise#"
PROFILED_STEPS = 5
"""Steps a benchmark profiles (before its timed window): enough to leave out one a busy machine
paused, few enough to cost little."""
LATE_S = 0.5e-3
"""A rank that arrives at the gradient exchange this much after the first is late in that step."""
PARTS = ("forward", "backward", "optimizer", "comm", "data", "sync", "straggler", "other")
"""A step's parts: compute (forward, backward, optimizer), exposed communication, waiting for the
next batch, host syncs, waiting for the slowest rank, and the remainder (the script's own code
between them)."""
LABELS = {
    "forward": "forward and loss",
    "backward": "backward",
    "optimizer": "optimizer step",
    "comm": "exposed comm",
    "data": "data wait",
    "sync": "host syncs",
    "straggler": "waiting for slowest rank",
    "other": "other",
}
_COMM = (
    "c10d::",
    "gloo:",
    "nccl:",
    "record_param_comms",
    "_c10d_functional",
    "FSDP::all_gather",
    "FSDP::post_backward_reduce",
    "aten::_allgather_base",
    "wait_tensor",
)
"""Names of the profiler's events that are (waits for) communication."""
_BACKWARD_COMPUTE = "autograd::engine::evaluate_function:"
_DATA = "enumerate(DataLoader)#"


@dataclass
class Span:
    name: str
    start: float
    end: float
    """Microseconds on this rank's clock, from the end of the barrier profiling started with."""
    children: list[Span] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e6


def _kind(name: str) -> str | None:
    if name.startswith(_DATA):
        return "data"
    # (torch's own span around the step, its hooks and rankwise's mark)
    if name.startswith("Optimizer.step#"):
        return "optimizer"
    if name.startswith(MARK):
        kind = name[len(MARK) :].split(" ", 1)[0]
        return kind if kind in ("forward", "backward", "optimizer", "sync", "exchange") else None
    return None


def _is_comm(name: str) -> bool:
    return name.startswith(_COMM) or "allreduce" in name or "all_reduce" in name


def _outermost(
    spans: Iterable[Span], keep: Callable[[Span], bool], stop: Callable[[Span], bool]
) -> list[Span]:
    """The spans ``keep`` selects, below each span ``stop`` ends the walk at, not nested in another
    selected one."""
    found: list[Span] = []

    def walk(span: Span) -> None:
        for child in span.children:
            if keep(child):
                found.append(child)
            elif not stop(child):
                walk(child)

    for span in spans:
        walk(span)
    return found


def _every(spans: Iterable[Span], keep: Callable[[Span], bool]) -> list[Span]:
    """Every span below ``spans`` that ``keep`` selects, nested or not."""
    found: list[Span] = []

    def walk(span: Span) -> None:
        for child in span.children:
            if keep(child):
                found.append(child)
            walk(child)

    for span in spans:
        walk(span)
    return found


def _inside(span: Span, other: Span) -> bool:
    return (
        other.start <= span.start
        and span.end <= other.end
        and (span.start, span.end) != (other.start, other.end)
    )


def step_records(spans: list[Span]) -> list[dict]:
    """This rank's profiled steps, one record each (seconds; times from the profile's barrier), from
    its main thread's spans (roots with their children).  A step runs from one optimizer step's end
    to the next's; each region counts in the step it starts in (torch's ``Optimizer.step#`` span
    ends just after the hook that closes a step, so the spans do not nest).  Torch ops outside the
    regions (a loss computed outside the model's forward, ``zero_grad``) count as forward
    compute."""
    top = [Span("", 0, 0, children=spans)]
    steps = sorted(
        _outermost(top, lambda s: s.name == MARK + "step", lambda s: False), key=lambda s: s.start
    )
    regions = _every(top, lambda s: _kind(s.name) is not None)
    outside = _outermost(
        top, lambda s: s.name.startswith("aten::"), lambda s: _kind(s.name) is not None
    )
    records = []
    for step in steps:

        def within(span: Span, step: Span = step) -> bool:
            return step.start <= span.start < step.end

        # keyed by region kind below (record[kind] += ...): a plain dict
        record: dict[str, Any] = {
            "wall": step.seconds,
            "start": step.start / 1e6,
            "exchange": 0.0,
            "data": 0.0,
            "forward": 0.0,
            "forward_comm": 0.0,
            "backward": 0.0,
            "backward_compute": 0.0,
            "arrival": None,
            "optimizer": 0.0,
            "optimizer_comm": 0.0,
            "sync": [],
            "loader": None,
        }
        mine = [region for region in regions if within(region)]
        # A region inside another of its kind is the same time (rankwise's optimizer mark in torch's
        # span); one inside another kind is that kind's time, not the outer one's (a Lightning
        # closure's forward and backward inside its optimizer step).  (By time: the profiler does
        # not always nest spans a hook opened.)
        kept: list[Span] = []
        for r in sorted(mine, key=lambda r: (r.start, -r.end)):
            if not any(
                _kind(o.name) == _kind(r.name) and o.start <= r.start and r.end <= o.end
                for o in kept
            ):
                kept.append(r)
        # A collective made inside forward, backward or the optimizer step is the framework's own
        # (DeepSpeed's reductions, Accelerate's): that region's communication, not a host sync the
        # script wrote.
        mine = [
            r
            for r in kept
            if _kind(r.name) != "sync"
            or not any(_kind(o.name) not in ("sync", "data") and _inside(r, o) for o in kept)
        ]
        for region in mine:
            inner = [o for o in mine if o is not region and _inside(o, region)]
            inner = [o for o in inner if not any(m is not o and _inside(o, m) for m in inner)]
            kind = _kind(region.name)
            assert kind is not None  # regions are the spans of a kind
            seconds = (
                min(region.end, step.end) - region.start - sum(o.end - o.start for o in inner)
            ) / 1e6
            if kind == "sync":
                record["sync"].append((region.name[len(MARK) + 5 :], region.start / 1e6, seconds))
                continue
            record[kind] += seconds
            if kind in ("data", "exchange"):
                if kind == "data":
                    record["loader"] = region.name[len(_DATA) :].split(".", 1)[0]
                continue
            comm = sum(
                s.seconds for s in _outermost([region], lambda s: _is_comm(s.name), lambda s: False)
            )
            if kind == "backward":
                compute = _outermost(
                    [region], lambda s: s.name.startswith(_BACKWARD_COMPUTE), lambda s: False
                )
                # (autograd ran on this thread: the CPU; a GPU's backward runs on a thread of its
                # own)
                if compute:
                    nested = sum(
                        s.seconds
                        for s in _outermost(compute, lambda s: _is_comm(s.name), lambda s: False)
                    )
                    record["backward_compute"] += sum(s.seconds for s in compute) - nested
                    record["arrival"] = max(s.end for s in compute) / 1e6
                else:
                    record["backward_compute"] += region.seconds - comm
                    record["arrival"] = region.end / 1e6
            else:
                record[f"{kind}_comm"] += comm
        record["forward"] += sum(s.seconds for s in filter(within, outside))
        records.append(record)
    return records


def combine(ranks: list[list[dict]]) -> list[RankParts]:
    """Every rank's parts (milliseconds a step, averaged over the steps all ranks profiled, but for
    a step a busy machine paused: :func:`~rankwise.measure.window_steps.paused`), from their
    :func:`step_records`.  The time a rank waited at the
    gradient exchange or at one of the script's collectives until the last rank arrived is
    ``straggler``; what it waited beyond that, communication; ``other``, the step less the other
    parts."""
    steps = min((len(records) for records in ranks), default=0)
    if not steps:
        return []
    per_step: list[list[dict]] = [[] for _ in ranks]
    for index in range(steps):
        records = [records[index] for records in ranks]
        # A rank's arrival: how long after its step began (when the previous exchange let it go) it
        # reached the gradient exchange.  Another rank's lateness is its own work, not when the
        # exchange let each rank go.
        arrivals = [r["arrival"] - r["start"] for r in records if r["arrival"] is not None]
        first, last = (
            (min(arrivals), max(arrivals)) if len(arrivals) == len(records) else (None, None)
        )
        # A script's own collectives are matched call by call where every rank made the same number.
        aligned_syncs = len({len(r["sync"]) for r in records}) == 1
        for parts_of_rank, record in zip(per_step, records, strict=True):
            # (an exchange a framework waits for outside backward, such as Horovod's synchronize, is
            # waited there too)
            waited = max(0.0, record["backward"] - record["backward_compute"]) + record.get(
                "exchange", 0.0
            )
            # one process: nothing to wait for in its backward but the engine itself
            if len(records) == 1:
                record = {**record, "backward_compute": record["backward"]}
                waited = 0.0
            arrival = record["arrival"] - record["start"] if last is not None else 0.0
            behind_others = min(waited, max(0.0, last - arrival)) if last is not None else 0.0
            sync = straggler = 0.0
            sites: dict[str, float] = {}
            for j, (site, start, seconds) in enumerate(record["sync"]):
                behind = (
                    max(
                        0.0,
                        max(r["sync"][j][1] - r["start"] for r in records)
                        - (start - record["start"]),
                    )
                    if aligned_syncs
                    else 0.0
                )
                sites[site] = sites.get(site, 0.0) + seconds
                straggler += min(seconds, behind)
                sync += seconds - min(seconds, behind)
            parts_of_rank.append(
                {
                    "forward": record["forward"] - record["forward_comm"],
                    "backward": record["backward_compute"],
                    "optimizer": record["optimizer"] - record["optimizer_comm"],
                    "comm": waited
                    - behind_others
                    + record["forward_comm"]
                    + record["optimizer_comm"],
                    "data": record["data"],
                    "sync": sync,
                    "straggler": behind_others + straggler,
                    "wall": record["wall"],
                    "late": arrival - first if first is not None else 0.0,
                    "last": last is not None and arrival == last and last - first > LATE_S,
                    "sites": sites,
                    "loader": record["loader"],
                }
            )
    combined: list[RankParts] = []
    # A step a busy machine paused is left out; one slowed by a rank's wait for its next batch is
    # the script's own (an occasional slow sample), kept; the rest are averaged, so the parts add up
    # to the step.
    excess = data_excess([[r["data"] for r in records] for records in per_step])
    for rank, records in enumerate(per_step):
        out = paused([r["wall"] for r in records], excess)
        kept = [r for r, left_out in zip(records, out, strict=True) if not left_out]
        parts = {part: statistics.fmean(r[part] for r in kept) for part in PARTS if part != "other"}
        step = statistics.fmean(r["wall"] for r in kept)
        parts["other"] = step - sum(parts.values())
        seen_sites = {site for r in kept for site in r["sites"]}
        combined.append(
            {
                "rank": rank,
                "step_ms": _ms(step),
                "parts_ms": {p: _ms(parts[p]) for p in PARTS},
                "late_ms": _ms(statistics.fmean(r["late"] for r in kept)),
                "sync_ms": {
                    site: _ms(statistics.fmean(r["sites"].get(site, 0.0) for r in kept))
                    for site in sorted(seen_sites)
                },
                "loader": next((r["loader"] for r in kept if r["loader"]), None),
                "steps": steps,
                "steps_kept": len(kept),
                "last_in": sum(r["last"] for r in kept),
            }
        )
    return combined


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


class StepProfile:
    """Profiles ``steps`` training steps on this rank: :meth:`start` at a step boundary (every rank
    at the same step), :meth:`begin`/:meth:`end` or :meth:`mark` around the regions,
    :meth:`step_done` after each optimizer step; :meth:`records` once it stopped."""

    def __init__(self, steps: int = PROFILED_STEPS):
        self.steps = steps
        self.after = 0
        """The step profiling starts after (set by its user)."""
        self.done = 0
        self._profiler: torch.profiler.profile | None = None
        self._open: dict[str, list] = {}
        self._records: list[dict] | None = None

    @property
    def running(self) -> bool:
        return self._profiler is not None

    @property
    def finished(self) -> bool:
        return self._records is not None

    def start(self, barrier: Callable[[], object]) -> None:
        """Start profiling; ``barrier()`` (every rank) starts the profiled steps together."""
        activities = [torch.profiler.ProfilerActivity.CPU]
        self._profiler = profiler = torch.profiler.profile(activities=activities)
        profiler.__enter__()
        with record_function(MARK + "align"):
            # Why: every rank leaves it at (nearly) the same instant: the first profiled steps start
            # together
            barrier()
        self.begin("step")

    def begin(self, name: str) -> None:
        if self.running:
            self._open.setdefault(name, []).append(record_function(MARK + name).__enter__())

    def end(self, name: str) -> None:
        if self.running and self._open.get(name):
            self._open[name].pop().__exit__(None, None, None)

    def mark(self, name: str):
        """A region, as a context manager (nothing while not profiling)."""
        return record_function(MARK + name) if self.running else contextlib.nullcontext()

    def step_done(self) -> None:
        """An optimizer step ended: the profiled step closes (and the next opens, or profiling
        stops)."""
        if not self.running:
            return
        self.end("step")
        self.done += 1
        if self.done < self.steps:
            self.begin("step")
        else:
            self.stop()

    def stop(self) -> None:
        """Stop profiling (also before all its steps ran: a script that ended) and read the steps
        back."""
        if not self.running:
            return
        for name in list(self._open):
            while self._open[name]:
                self.end(name)
        profiler, self._profiler = self._profiler, None
        assert profiler is not None  # running
        profiler.__exit__(None, None, None)
        self._records = step_records(main_thread_spans(profiler.events()))

    def records(self) -> list[dict]:
        self.stop()
        return self._records or []


def main_thread_spans(events) -> list[Span]:
    """The profiler's events on the thread that started it (the training loop's), as spans (roots),
    timed from the end of its barrier."""
    align = next((e for e in events if e.name == MARK + "align"), None)
    if align is None:
        return []
    zero = align.time_range.end
    spans: dict[int, Span] = {}
    roots = []
    for event in sorted(
        (e for e in events if e.thread == align.thread), key=lambda e: e.time_range.start
    ):
        span = Span(event.name, event.time_range.start - zero, event.time_range.end - zero)
        spans[id(event)] = span
        parent = spans.get(id(event.cpu_parent)) if event.cpu_parent is not None else None
        if parent is None:
            roots.append(span)
        else:
            parent.children.append(span)
    return roots


def model_facts(models: Iterable[torch.nn.Module]) -> ModelFacts:
    """What the explanation needs of the models a step ran: DDP's buckets (its logger), FSDP's
    units."""
    facts: ModelFacts = {}
    for model in models:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            # (the logger's data is DDP's private API: best effort)
            with contextlib.suppress(Exception):
                data = model._get_ddp_logging_data()
                sizes = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
                facts["ddp"] = {
                    "buckets": len([s for s in sizes.split(",") if s.strip()]),
                    "bucket_cap_mb": round(int(data.get("bucket_cap_bytes", 0)) / 2**20, 2),
                    "parameter_mb": round(
                        int(data.get("total_parameter_size_bytes", 0)) / 2**20, 2
                    ),
                    "comm_hook": data.get("comm_hook") or None,
                }
        units = [
            m
            for m in model.modules()
            if type(m).__name__.startswith(("FSDP", "FullyShardedDataParallel"))
        ]
        if units:
            facts["fsdp_units"] = len(units)
    return facts
