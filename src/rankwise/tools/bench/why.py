"""Why a bench row is slow: its step-time breakdown (:mod:`rankwise.measure.breakdown`) read into
one cause and the change that recovers it, from evidence only.

The loss a row can recover is what is not compute: waiting for the slowest rank, for the next batch,
for communication compute did not hide, and host syncs.  The largest is named when it is at least
:data:`NOISE` of the step; a rank the others wait for is explained by the part in which it spends
more than they do before it arrives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rankwise.errors import ConfigError
from rankwise.measure.breakdown import LABELS, PARTS, PROFILED_STEPS
from rankwise.measure.records import Breakdown, RankParts
from rankwise.tools.bench.records import BenchRow, BreakdownColumns, Explanation
from rankwise.tools.bench.why_window import (
    explain_window,
    timed_ranks,
    window_lines,
    window_step,
    workers,
)

NOISE = 0.10
"""A loss below this share of the step is not named: profiled steps vary by about this much on a
shared CPU."""
LOSSES = ("straggler", "data", "comm", "sync")
DDP_DEFAULT_BUCKET_MB = 25.0
ONE_BUCKET_MB = 1.0
"""A bucket size that lets a model of a few MB overlap its exchange with backward."""
_BEFORE_ARRIVAL = ("data", "forward", "backward", "sync", "other")
"""Parts a rank goes through before it arrives at the gradient exchange."""


def explain(breakdown: Breakdown | None) -> Explanation | None:
    """``{"part", "rank", "ms", "share", "line"}``: the row's largest loss and its fix (``part``
    None: nothing above the noise; ``"unexplained"``: the profiled steps do not stand for the timed
    window), or None without a breakdown.  What the window's every step shows comes first
    (:func:`~rankwise.tools.bench.why_window.explain_window`)."""
    if breakdown is None or not breakdown.get("ranks"):
        return None
    ranks = breakdown["ranks"]
    windowed = explain_window(breakdown)
    if windowed is not None:
        return windowed
    step = max(r["step_ms"] for r in ranks) or 1e-9
    loss, rank = max(
        ((part, r) for part in LOSSES for r in ranks), key=lambda pr: pr[1]["parts_ms"][pr[0]]
    )
    ms = rank["parts_ms"][loss]
    waiting = max(ranks, key=lambda r: r["parts_ms"]["straggler"])
    # (a rank the machine delayed once or twice: noise, not a straggler)
    if not _consistently_late(ranks):
        loss, rank = max(
            ((part, r) for part in LOSSES if part != "straggler" for r in ranks),
            key=lambda pr: pr[1]["parts_ms"][pr[0]],
        )
        ms = rank["parts_ms"][loss]
    elif waiting["parts_ms"]["straggler"] >= max(NOISE * step, 0.5 * ms):
        # (what the late rank lost, others wait)
        loss, rank, ms = "straggler", waiting, waiting["parts_ms"]["straggler"]
    if ms < NOISE * step:
        compute = min(
            sum(r["parts_ms"][p] for p in ("forward", "backward", "optimizer")) / r["step_ms"]
            for r in ranks
            if r["step_ms"]
        )
        return {
            "part": None,
            "rank": None,
            "ms": 0.0,
            "share": 0.0,
            "line": f"no loss above the noise ({NOISE:.0%} of the step): at least {compute:.0%} of "
            "each rank's step computes",
        }
    line = {"straggler": _straggler, "data": _data, "comm": _comm, "sync": _sync}[loss](
        ranks, rank, breakdown
    )
    return {
        "part": loss,
        "rank": rank["rank"],
        "ms": ms,
        "share": round(ms / step, 3),
        "line": line,
    }


def _consistently_late(ranks: list[RankParts]) -> bool:
    """Whether one rank arrived last at the gradient exchange in most of the profiled steps."""
    late = max(ranks, key=lambda r: r.get("last_in", 0))
    return late.get("last_in", 0) > late.get("steps_kept", 0) / 2


def _straggler(ranks: list[RankParts], waiting: RankParts, breakdown: Breakdown) -> str:
    late = max(ranks, key=lambda r: r["late_ms"])
    others = [r for r in ranks if r is not late]
    excess = {
        part: late["parts_ms"][part] - sum(r["parts_ms"][part] for r in others) / len(others)
        for part in _BEFORE_ARRIVAL
    }
    part = max(excess, key=lambda name: excess[name])
    head = (
        f"rank {waiting['rank']} waits {waiting['parts_ms']['straggler']:.1f} ms a step for rank "
        f"{late['rank']}, which arrives {late['late_ms']:.1f} ms late at the gradient exchange"
    )
    if excess[part] < 0.5 * late["late_ms"]:
        return (
            f"{head} (no one part of its step explains it) → look for what rank {late['rank']} "
            "does differently"
        )
    cause = {
        "data": f"its data loader waits {excess[part]:.1f} ms a step longer ({workers(late)})",
        "forward": f"its forward takes {excess[part]:.1f} ms a step longer",
        "backward": f"its backward takes {excess[part]:.1f} ms a step longer",
        "sync": f"its host syncs take {excess[part]:.1f} ms a step longer ({_sites(late)})",
        "other": "its own code between forward, backward and the optimizer takes "
        f"{excess[part]:.1f} ms a step longer",
    }[part]
    fix = {
        "data": "DataLoader(num_workers=2 or more, persistent_workers=True), or a lighter "
        "__getitem__/collate_fn",
        "sync": "read values and synchronise every N steps, not every step",
    }.get(
        part,
        f"find what rank {late['rank']} does that the others do not (more data, other work, a "
        "slower device)",
    )
    return f"{head}: {cause} → {fix}"


def _data(ranks: list[RankParts], rank: RankParts, breakdown: Breakdown) -> str:
    return (
        f"rank {rank['rank']} waits {rank['parts_ms']['data']:.1f} ms a step for its next batch "
        f"({workers(rank)}) → DataLoader(num_workers=2 or more, pin_memory=True on a GPU, "
        "persistent_workers=True)"
    )


def _comm(ranks: list[RankParts], rank: RankParts, breakdown: Breakdown) -> str:
    facts = breakdown.get("facts") or {}
    head = (
        f"communication not hidden behind compute: {rank['parts_ms']['comm']:.1f} ms a step on "
        f"rank {rank['rank']}"
    )
    ddp = facts.get("ddp")
    if ddp and ddp["buckets"] > 1 and ddp["bucket_cap_mb"] < DDP_DEFAULT_BUCKET_MB:
        return (
            f"{head}, {ddp['buckets']} all-reduces a step (bucket_cap_mb={ddp['bucket_cap_mb']:g} "
            f"for {ddp['parameter_mb']:g} MB of gradients) → "
            "DistributedDataParallel(bucket_cap_mb=25), DDP's default"
        )
    if ddp and ddp["buckets"] == 1 and ddp["parameter_mb"] > 2 * ONE_BUCKET_MB:
        return (
            f"{head}: all {ddp['parameter_mb']:g} MB of gradients are one bucket, exchanged only "
            "once backward has ended, so nothing overlaps → "
            f"DistributedDataParallel(bucket_cap_mb={ONE_BUCKET_MB:g}) starts the exchange during "
            "backward (on a CPU only where cores are free for the backend's threads)"
        )
    if facts.get("fsdp_units") == 1:
        return (
            f"{head}; the model is one FSDP unit, so its all-gather cannot overlap any compute → "
            "wrap each layer (fully_shard every block, then the model)"
        )
    if facts.get("fsdp_units"):
        return (
            f"{head}, FSDP's all-gathers and reduce-scatters over its {facts['fsdp_units']} units "
            "→ more compute per exchange: a larger batch per rank; or ddp, where the whole model "
            "and its optimizer fit a rank"
        )
    if ddp:
        return (
            f"{head}, {ddp['parameter_mb']:g} MB of gradients in {ddp['buckets']} bucket(s) → more "
            "compute per exchange: a larger batch per rank, or gradient accumulation under "
            "no_sync(); or bf16 gradients (a comm hook)"
        )
    return (
        f"{head} → more compute per exchange: a larger batch per rank, or fewer, larger collectives"
    )


def _sync(ranks: list[RankParts], rank: RankParts, breakdown: Breakdown) -> str:
    return (
        f"host syncs {rank['parts_ms']['sync']:.1f} ms a step on rank {rank['rank']} "
        f"({_sites(rank)}) → drop per-step barriers; reduce values for logging every N steps; add "
        "losses up on the device and read them once"
    )


def _sites(rank: RankParts) -> str:
    sites = sorted(rank.get("sync_ms", {}).items(), key=lambda kv: -kv[1])
    return ", ".join(f"{site}: {ms:.1f} ms" for site, ms in sites[:3]) or "none named"


def cells(breakdown: Breakdown | None) -> dict[str, float]:
    """The table's cells, in milliseconds a step: compute averaged over the ranks, each loss the
    most any rank spent in it (a straggler's own wait and the others' wait for it both show); the
    data wait over the whole timed window where it was timed so."""
    if breakdown is None or not breakdown.get("ranks"):
        return {}
    ranks = breakdown["ranks"]
    compute = [
        r["parts_ms"]["forward"] + r["parts_ms"]["backward"] + r["parts_ms"]["optimizer"]
        for r in ranks
    ]
    timed = timed_ranks(breakdown)
    return {
        "step_ms": round(max(r["step_ms"] for r in ranks), 3),
        "compute_ms": round(sum(compute) / len(ranks), 3),
        **{f"{part}_ms": max(r["parts_ms"][part] for r in ranks) for part in LOSSES},
        **({"data_ms": max(r["data_ms"] for r in timed)} if timed else {}),
    }


def detail(name: str, breakdown: Breakdown | None) -> str:
    """``--explain ROW``: every rank's parts, the steps profiled, and the cause."""
    if not breakdown or not breakdown.get("ranks"):
        return (
            f"{name}: no step-time breakdown (the row did not run, or ended before its profiled "
            "steps)"
        )
    steps = breakdown.get("steps")
    lines = [
        f"{name}: steps {steps[0]}-{steps[1]} profiled, between the warm-up and the timed window"
        if steps
        else name
    ]
    window = window_step(breakdown)
    for r in breakdown["ranks"]:
        cost = (
            f", {r['step_ms'] / window - 1:+.0%} against the window's {window:.1f} ms"
            if window
            else ""
        )
        lines.append(f"  rank {r['rank']}: {r['step_ms']:.1f} ms a profiled step{cost}")
        for part in PARTS:
            ms = r["parts_ms"][part]
            lines.append(
                f"    {LABELS[part]:<26}{ms:>9.2f} ms  {ms / r['step_ms']:>5.0%}"
                if r["step_ms"]
                else ""
            )
        for site, ms in sorted(r.get("sync_ms", {}).items(), key=lambda kv: -kv[1]):
            lines.append(f"      {site}: {ms:.2f} ms")
        if r["late_ms"] > 0.05:
            lines.append(
                f"    arrives {r['late_ms']:.2f} ms after the first rank at the gradient exchange"
            )
    lines += window_lines(breakdown)
    if breakdown.get("device") == "cuda":
        lines.append("  (on a GPU these are the host's times: kernels are queued, not timed)")
    why = explain(breakdown)
    assert why is not None  # a breakdown with ranks (above) has a cause
    lines.append(f"  why: {why['line']}")
    return "\n".join(lines)


def summary(breakdown: Breakdown | None) -> BreakdownColumns:
    """A bench row's breakdown entries: the per-rank detail, the table's cells, the cause."""
    found = explain(breakdown)
    return {"breakdown": breakdown, "steps": cells(breakdown) or None, "why": found}


def step_cell(steps: Mapping[str, float] | None) -> str:
    """``compute · comm · data · sync · wait`` in milliseconds a step (or "—")."""
    if not steps:
        return "—"
    return " · ".join(
        f"{steps[key]:.1f}"
        for key in ("compute_ms", "comm_ms", "data_ms", "sync_ms", "straggler_ms")
    )


def notes(rows: list[BenchRow]) -> list[str]:
    """The lines under the table: how the breakdown was measured, and each row's cause."""
    explained = [line for line in rows if line.get("why")]
    if not explained:
        return []
    # (a cause comes from a breakdown)
    breakdowns = [line.get("breakdown") for line in explained]
    first = breakdowns[0]
    where = (
        f"steps {first['steps'][0]}-{first['steps'][1]}"
        if first and first.get("steps")
        else f"{PROFILED_STEPS} steps"
    )
    out = [
        f"step ms: {where} of each row profiled (torch.profiler; a built-in row's last steps, "
        "after its timed window; a --script row's between its warm-up and its window): compute "
        "averaged over the ranks; exposed comm, data wait, host syncs and waiting "
        "for the slowest rank, the most any rank spent (`rankwise bench --explain ROW` shows "
        "every rank)"
    ]
    if any(breakdown and breakdown.get("window") for breakdown in breakdowns):
        out.append(
            "data wait: each rank's wait for its batches over every step of the timed window (a "
            "slow sample now and then shows there); a row whose profiled step differs from its "
            "window's by more than the noise says it cannot explain the row"
        )
    if any(breakdown and breakdown.get("device") == "cuda" for breakdown in breakdowns):
        out.append("step ms on a GPU: the host's times (kernels are queued, not timed)")
    out += [
        f"- {line['row']}: why: {why['line']}" for line in explained if (why := line.get("why"))
    ]
    return out


COLOURS = {
    "forward": "tab:blue",
    "backward": "tab:cyan",
    "optimizer": "tab:purple",
    "comm": "tab:orange",
    "data": "tab:brown",
    "sync": "tab:pink",
    "straggler": "tab:red",
    "other": "tab:gray",
}


def plot(axis: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """A stacked bar per rank of each row: where its profiled step went."""
    bars = [
        (f"{line['row']} r{r['rank']}", r["parts_ms"])
        for line in rows
        for r in line["breakdown"]["ranks"]
    ]
    _stack(axis, [label for label, _ in bars], [parts for _, parts in bars])
    axis.invert_yaxis()
    axis.set_title("where each rank's step goes")


def plot_rows(axis: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """A stacked bar per row (its ranks' mean; the axis shared with the table's other panels, in its
    order)."""
    _stack(axis, [line["row"] for line in rows], [_mean_parts(line) for line in rows])
    axis.set_title("step ms, mean over ranks (profiled steps)")


def _mean_parts(line: Mapping[str, Any]) -> dict[str, float]:
    """A row's step parts, the mean over its ranks (0 where nothing was profiled)."""
    ranks = (line.get("breakdown") or {}).get("ranks")
    if not ranks:
        return dict.fromkeys(PARTS, 0.0)
    return {part: sum(r["parts_ms"][part] for r in ranks) / len(ranks) for part in PARTS}


def _stack(axis: Any, labels: list[str], bars: list[dict[str, float]]) -> None:
    left = [0.0] * len(bars)
    for part in PARTS:
        widths = [max(0.0, parts[part]) for parts in bars]
        axis.barh(labels, widths, left=left, color=COLOURS[part], label=LABELS[part])
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axis.set_xlabel("ms a profiled step")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def check_row(name: str | None, names: list[str]) -> None:
    """``--explain NAME``: refused before anything runs where no row has that name."""
    if name is not None and name not in names:
        raise ConfigError(f"--explain {name}: no such row (rows: {', '.join(names)})")


def explained(rows: list[BenchRow], name: str) -> str:
    """``--explain NAME`` after a run: that row's :func:`detail`."""
    line = next((line for line in rows if line["row"] == name), None)
    if line is None:
        raise ConfigError(
            f"--explain {name}: no such row (rows: {', '.join(r['row'] for r in rows)})"
        )
    return detail(name, line.get("breakdown"))


def explain_report(path: Path, name: str) -> str:
    """``--explain NAME --report PATH``: the row's detail from an earlier bench's report.json."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"--report {path}: not a rankwise bench report.json ({error})") from None
    return explained(rows, name)
