"""ZeRO-3's parameter gathers in one step, as DeepSpeed's coordinator makes them: replayed over the
forward's module calls the plan recorded
(:attr:`~rankwise.tools.plan.fake_step.Trace.module_events`).

DeepSpeed 0.19 (``runtime/zero/partitioned_param_coordinator.py``) hooks every module.  Before a
module runs (its forward, and its backward in the reverse order) ``fetch_sub_module``:

1. gathers the module's own partitioned parameters that are not available, in one call;
2. drops them from the queue of the step's recorded parameter uses;
3. prefetches the next uses in the queue, in one call, while the elements it adds stay under
   ``min(stage3_max_live_parameters - elements available, stage3_prefetch_bucket_size)``.

After a module runs, ``release_sub_module`` partitions its parameters again, except a parameter the
prefetch already fetched for a later use, or that a module within ``stage3_max_reuse_distance``
elements of upcoming calls uses again.  Parameters below ``stage3_param_persistence_threshold`` stay
whole on every rank and are never gathered.  So a small model is gathered in one call in the forward
and stays gathered through its backward; a large one is gathered about once per module each way.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rankwise.tools.plan.fake_step import Trace


@dataclass
class Gathers:
    """The all-gathers of one pass."""

    calls: int = 0
    """Calls made."""
    elements: int = 0
    """Parameter elements they gathered."""
    largest: int = 0
    """Elements of the largest call that gathered two parameters or more: its flat buffer
    (``partition_parameters.py``, ``_all_gather_dtype``) lives beside each parameter's own copy; a
    call of one parameter gathers straight into it (``_all_gather_sequential``)."""
    live: int = 0
    """The most parameter elements gathered at once (a prefetch may pass
    ``stage3_max_live_parameters`` by the parameter it adds last)."""


@dataclass
class _Coordinator:
    numels: list[int]
    persistent: set[int]
    bucket: int
    max_live: int
    reuse: int
    order: list[tuple[int, ...]]
    """Each fetch's parameters, in the step's fetch order (DeepSpeed's ``__submodule_order``)."""
    available: set[int] = field(default_factory=set)
    live: int = 0
    step: int = 0
    fetched_for: dict[int, int] = field(default_factory=dict)
    queue: deque[tuple[int, int]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.queue = deque((p, at) for at, params in enumerate(self.order) for p in params)

    def _gather(self, params: set[int], into: Gathers) -> None:
        wanted = [p for p in params if p not in self.available and p not in self.persistent]
        if wanted:
            elements = sum(self.numels[p] for p in wanted)
            into.calls += 1
            into.elements += elements
            if len(wanted) > 1:
                into.largest = max(into.largest, elements)
            self.available.update(wanted)
            self.live += elements

    def fetch(self, params: tuple[int, ...], into: Gathers) -> None:
        own = set(params)
        self._gather(own, into)
        # (the current module's uses leave the queue, unless a prefetch took them already)
        pending = {p for p in own if self.fetched_for.get(p, -1) < self.step}
        dropped: set[int] = set()
        while self.queue and len(dropped) < len(pending):
            p, at = self.queue.popleft()
            self.fetched_for[p] = at
            dropped.add(p)
        limit = min(self.max_live - self.live, self.bucket)
        prefetch: set[int] = set()
        elements = 0
        while self.queue and elements < limit:
            p, at = self.queue.popleft()
            self.fetched_for[p] = max(self.fetched_for.get(p, -1), at)
            if p not in self.available and p not in self.persistent and p not in prefetch:
                prefetch.add(p)
                elements += self.numels[p]
        self._gather(prefetch, into)
        into.live = max(into.live, self.live)
        self.step += 1

    def release(self, params: tuple[int, ...]) -> None:
        free = {p for p in params if p not in self.persistent}
        free -= {p for p in params if self.fetched_for.get(p, -1) > self.step}
        traversed = 0
        for upcoming in self.order[self.step :]:
            if traversed >= self.reuse:
                break
            for p in upcoming:
                free.discard(p)
                traversed += self.numels[p]
        for p in free & self.available:
            self.available.discard(p)
            self.live -= self.numels[p]


def gathers(
    trace: Trace, *, persistence: int, bucket: int, max_live: int, reuse: int | None = None
) -> dict[str, Gathers]:
    """The partitioned parameters' all-gathers of one micro-batch's forward and backward passes
    (``persistence``, ``bucket``, ``max_live``, ``reuse``: ZeRO-3's persistence threshold, prefetch
    bucket, live parameters and reuse distance, in elements; ``reuse`` defaults to ``max_live``, as
    rankwise's ``deepspeed.max_live_parameters`` sets both)."""
    events = trace.module_events
    # the backward runs the forward's calls in reverse: a call's end is where its backward starts
    step = [("forward", e) for e in events] + [("backward", -e) for e in reversed(events)]
    order = [trace.module_params[e - 1] for _, e in step if e > 0]
    coordinator = _Coordinator(
        trace.numels,
        {i for i, n in enumerate(trace.numels) if n < persistence},
        bucket,
        max_live,
        max_live if reuse is None else reuse,
        order,
    )
    passes = {"forward": Gathers(), "backward": Gathers()}
    for name, event in step:
        if event > 0:
            coordinator.fetch(trace.module_params[event - 1], passes[name])
        else:
            coordinator.release(trace.module_params[-event - 1])
    return passes
