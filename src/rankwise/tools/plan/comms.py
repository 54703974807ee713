"""What a strategy communicates in one optimizer step, and how long a collective takes.

Collectives per step: what each strategy's own file declares
(:class:`rankwise.strategies.facts.StepCall`: the operation, what it carries, how many calls, the
pass it overlaps), sized here from the trace.  Message sizes follow the nccl-tests convention: the
larger buffer, the whole gradient for an all-reduce, the gathered output for an all-gather, the
input for a reduce-scatter.

A collective's time is the alpha-beta model nccl-tests' bus bandwidth defines: ``latency + size x
factor / busbw``, factor 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter; the
latency, a call's time at two ranks, grows with log2(n) (small messages take NCCL's trees).  The bus
bandwidth is the device's link (:mod:`~rankwise.tools.plan.devices`: NVLink inside a node, the
network adapter across nodes, at ``LINK_EFFICIENCY``), or what ``rankwise comm bench`` measured
(``--comm comm.json``: the median busbw of messages of 4 MiB and more, and the smallest message's
time as the latency).  Where every core computes (a CPU whose ranks' threads use them all) a call
costs more than its back-to-back latency: the transport waits for a core; a ``between.json`` beside
the ``comm.json`` (:mod:`~rankwise.tools.plan.between`, measured by ``--validate``) gives each
call's cost between two computations, used instead.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from rankwise.errors import ConfigError
from rankwise.strategies import lookup
from rankwise.strategies.facts import StepCall
from rankwise.strategies.options import DeepSpeedOptions
from rankwise.tools.plan.between import FILE as BETWEEN
from rankwise.tools.plan.devices import LINK_EFFICIENCY, Device
from rankwise.tools.plan.fake_step import Trace
from rankwise.tools.plan.rank_memory import reduce_buckets, sub_groups
from rankwise.tools.plan.zero3_fetch import gathers

DEEPSPEED_BUCKET = DeepSpeedOptions().bucket_size
"""rankwise's ``deepspeed.bucket_size`` (elements), where the caller gives none."""

OPS = ("all_reduce", "all_gather", "reduce_scatter")
LARGE = 4 * 2**20


def factor(op: str, n: int) -> float:
    """Bus bytes per message byte for ``op`` on ``n`` ranks (nccl-tests)."""
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


@dataclass(frozen=True)
class Collective:
    op: str
    """``all_reduce``, ``all_gather`` or ``reduce_scatter``."""
    nbytes: int
    """Bytes per step, summed over its calls (message sizes, the nccl-tests convention)."""
    calls: int
    """Calls per optimizer step."""
    overlapped: str
    """The pass the strategy runs it beside (``forward``, ``backward``), or ``""``: nothing hides
    it."""
    what: str
    """What it carries."""


def _units(trace: Trace) -> int:
    return len(trace.block_param_numels) + 1


def _carried(call: StepCall, trace: Trace, half: bool, persistence: int) -> tuple[int, list[int]]:
    """(bytes, the tensors' elements) one micro-batch's ``call`` moves over all its calls."""
    if call.carries == "norm":
        return 4, [1]
    if call.carries == "gradients":
        return trace.gradient_bytes, trace.numels
    if call.carries == "parameters":
        numels = trace.numels
    elif call.carries == "layer-parameters":
        numels = trace.block_param_numels
    elif call.carries == "partitioned-parameters":
        numels = [n for n in trace.numels if n >= persistence]
    else:  # persistent-parameters: the smaller ones, whole on every rank
        numels = [n for n in trace.numels if n < persistence]
    itemsize = 2 if half and call.half_at_mixed else trace.itemsize
    return itemsize * sum(numels), numels


def _calls(
    call: StepCall, trace: Trace, nbytes: int, numels: list[int], world: int, bucket: int | None
) -> int:
    """Calls of ``call`` in one micro-batch (``zero3-fetches``: counted by
    :func:`~rankwise.tools.plan.zero3_fetch.gathers`, with the bytes)."""
    if call.count == "buckets":
        return max(1, math.ceil(nbytes / call.bucket))
    if call.count == "element-buckets":
        return len(reduce_buckets(numels, bucket or call.bucket))
    if call.count == "units":
        return _units(trace)
    if call.count == "layer-units":
        return _units(trace) - 1
    if call.count == "each":
        return len(numels)
    if call.count == "one":
        return 1
    if call.count == "zero3-sub-groups":
        return len(sub_groups(trace.numels, world, bucket or call.bucket)) or 1
    return trace.param_groups  # parameter-groups


def collectives(
    strategy: str,
    trace: Trace,
    world: int,
    grad_accum: int,
    *,
    half: bool = False,
    clips: bool = False,
    persistence: int = 100_000,
    bucket: int | None = None,
    max_live: int = 10_000_000,
) -> list[Collective]:
    """What ``strategy`` communicates per optimizer step at ``world`` ranks, from the collectives
    its file declares (``half``: a mixed precision; ``clips``: the step clips the gradients' norm;
    ``persistence``: ZeRO-3's threshold below which a parameter stays whole; ``bucket``:
    DeepSpeed's reduction and prefetch bucket, rankwise's ``deepspeed.bucket_size``, where not the
    declared one; ``max_live``: ZeRO-3's live parameters; all in elements)."""
    facts = lookup(strategy).facts
    if facts is None or facts.layout is None:
        raise ConfigError(f"rankwise plan knows no communication model for strategy {strategy!r}")
    if world == 1:
        return []
    made = []
    for call in facts.step:
        if call.when_clipping and not clips:
            continue
        nbytes, numels = _carried(call, trace, half, persistence)
        calls = _calls(call, trace, nbytes, numels, world, bucket)
        if call.count == "zero3-fetches":
            prefetch = bucket or DEEPSPEED_BUCKET
            fetched = gathers(trace, persistence=persistence, bucket=prefetch, max_live=max_live)[
                call.beside
            ]
            calls, nbytes = fetched.calls, nbytes * fetched.elements // max(1, sum(numels))
        repeats = grad_accum if call.every_micro_batch else 1
        # (no call where there is nothing to move: the root is not gathered again for its backward
        # pass; ZeRO-3 gathers no layer whose parameters all stay whole)
        if calls and nbytes:
            made.append(
                Collective(call.op, nbytes * repeats, calls * repeats, call.beside, call.what)
            )
    return made


@dataclass
class Bandwidth:
    """Bus bandwidth and latency per collective, for one link."""

    busbw: dict[str, float]
    """Bytes/s per operation."""
    latency_s: dict[str, float]
    """Seconds of the smallest call per operation, at :attr:`measured_at` ranks."""
    measured_at: int = 2
    """Ranks the latencies were measured at."""
    call_s: dict[str, float] = field(default_factory=dict)
    """Seconds a call costs between two computations, per operation, where every core computes
    (:mod:`~rankwise.tools.plan.between`; empty: not measured, the latency stands in)."""
    source: str = ""
    """Where the numbers come from, in words."""
    notes: list[str] = field(default_factory=list)
    """Caveats the plan's reading repeats."""

    def seconds(self, op: str, nbytes: float, calls: int, n: int, busy: bool = False) -> float:
        """Time of ``calls`` calls moving ``nbytes`` in all on ``n`` ranks; ``busy``: every core
        computes, so each call costs :attr:`call_s` where it was measured."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        # Small messages go through trees (NCCL) or a few hops: the latency grows with log2 of the
        # ranks.
        steps = math.log2(n) / math.log2(max(2, self.measured_at))
        latency = self.call_s.get(op, self.latency_s[op]) if busy else self.latency_s[op]
        return calls * latency * steps + nbytes * factor(op, n) / self.busbw[op]


def from_device(device: Device, nodes: int) -> Bandwidth:
    """The device's own link: inside one node, or across nodes (the slower link every collective
    then crosses)."""
    link = device.inter_node if nodes > 1 else device.intra_node
    efficiency = 1.0 if device.name == "cpu" else LINK_EFFICIENCY
    where = "across nodes" if nodes > 1 else "inside a node"
    return Bandwidth(
        dict.fromkeys(OPS, link * efficiency),
        dict.fromkeys(OPS, device.latency_s),
        source=f"{device.name} {where}: {link * efficiency / 1e9:g} GB/s bus bandwidth "
        f"({device.source})",
    )


def from_comm_bench(path: Path) -> tuple[Bandwidth, int]:
    """The bandwidth ``rankwise comm bench`` measured (its ``comm.json``), and how many nodes it
    spanned."""
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
        rows = result["results"]
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(
            f"--comm {path}: not a comm.json written by rankwise comm bench ({e})"
        ) from None
    busbw, latency = {}, {}
    for op in OPS:
        mine = [row for row in rows if row["op"] == op]
        if not mine:
            continue
        large = [row["busbw_GBps"] for row in mine if row["bytes"] >= LARGE] or [
            max(r["busbw_GBps"] for r in mine)
        ]
        busbw[op] = statistics.median(large) * 1e9
        latency[op] = min(mine, key=lambda row: row["bytes"])["time_us"] / 1e6
    if not busbw:
        raise ConfigError(f"--comm {path}: it measured none of {', '.join(OPS)}")
    for op in OPS:  # an operation it did not measure: the all_reduce's numbers (the same ring)
        busbw.setdefault(op, busbw.get("all_reduce") or next(iter(busbw.values())))
        latency.setdefault(op, latency.get("all_reduce") or next(iter(latency.values())))
    world = int(result.get("world_size", 2))
    source = (
        f"rankwise comm bench ({path}: {world} ranks, {result.get('backend', '?')}): "
        + ", ".join(f"{op} {busbw[op] / 1e9:.2f} GB/s" for op in OPS)
    )
    call_s = _between(Path(path).with_name(BETWEEN), world)
    if call_s:
        source += "; a call between computations " + ", ".join(
            f"{op} {call_s[op] * 1e3:.2f} ms" for op in call_s
        )
    return Bandwidth(busbw, latency, measured_at=world, call_s=call_s, source=source), int(
        result.get("nnodes", 1)
    )


def _between(path: Path, world: int) -> dict[str, float]:
    """Each call's cost between computations from ``between.json`` (empty when there is none for
    ``world``)."""
    if not path.is_file():
        return {}
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
        if int(result["world_size"]) != world:
            return {}
        return {op: float(us) / 1e6 for op, us in result["call_us"].items() if op in OPS}
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path}: not a between.json written by rankwise plan --validate ({e})"
        ) from None
