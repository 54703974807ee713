"""``rankwise comm bench``'s outputs: the nccl-tests-style table, comm.json, comm.md and comm.png,
and the reading."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from rankwise.checkpoint import write_text_atomic
from rankwise.tools.comm.records import Analysis, BucketAdvice, CommResult, CommRow

LARGE = 16 * 2**20
"""From this size a collective is bandwidth-bound; the goal compares its busbw with the ceilings."""
KNEE = 0.9
"""A bucket is "big enough" once all_reduce reaches this fraction of its peak busbw."""
DDP_BUCKET_MB, DDP_FIRST_BUCKET_MB = 25, 1
"""DDP's defaults: ``bucket_cap_mb`` and the smaller first bucket it starts with."""

CEILINGS = {
    "tcp_loopback_GBps": "loopback TCP one way",
    "tcp_loopback_bidirectional_GBps": "loopback TCP each way with both busy",
    "memcpy_1thread_GBps": "one-thread memcpy",
    "tcp_between_nodes_GBps": "TCP node 0 <- node 1",
    "tcp_between_nodes_bidirectional_GBps": "TCP between nodes each way with both busy",
}
"""What each measured ceiling is, in the report's words."""

HEADER = (
    f"{'size(B)':>12} {'count':>11} {'type':>9} {'time(us)':>10} {'p90(us)':>10} "
    f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}"
)


def _mib(nbytes: float) -> str:
    return (
        f"{nbytes / 2**20:g} MiB"
        if nbytes >= 2**20
        else f"{nbytes / 1024:g} KiB"
        if nbytes >= 1024
        else f"{nbytes:g} B"
    )


def analyse(result: CommResult) -> Analysis:
    """Peak and large-message busbw per operation, the ratio to the ceilings, the DDP bucket advice,
    the harness."""
    rows = result["results"]
    limits = result.get("ceilings") or {}
    ops = list(dict.fromkeys(row["op"] for row in rows))
    reading: Analysis = {"ops": {}}
    for op in ops:
        mine = [row for row in rows if row["op"] == op]
        large = [row["busbw_GBps"] for row in mine if row["bytes"] >= LARGE]
        large_busbw = statistics.median(large) if large else None
        reading["ops"][op] = {
            "peak_busbw_GBps": max(row["busbw_GBps"] for row in mine),
            "large_busbw_GBps": large_busbw,
            "large_vs_ceilings": {
                name: large_busbw / ceiling
                for name, ceiling in limits.items()
                if large_busbw is not None and ceiling
            },
        }
    if "all_reduce" in ops:
        reading["bucket"] = bucket_advice([row for row in rows if row["op"] == "all_reduce"])
    if result.get("harness"):
        reading["harness_overhead"] = result["harness"]["overhead"]
    return reading


def bucket_advice(rows: list[CommRow]) -> BucketAdvice:
    """Which DDP ``bucket_cap_mb`` the all_reduce curve suggests: the smallest size near peak
    bandwidth.

    Smaller buckets start communicating earlier in backward (more overlap) but each pays the
    per-call latency; past the knee a bigger bucket buys no bandwidth and only delays the start.
    """
    peak = max(row["busbw_GBps"] for row in rows)
    knee = next(
        (row for row in sorted(rows, key=lambda r: r["bytes"]) if row["busbw_GBps"] >= KNEE * peak),
        None,
    )

    def at(mb: float) -> float | None:
        if max(row["bytes"] for row in rows) < mb * 2**20:
            return None  # not measured that far
        below = [row for row in rows if row["bytes"] <= mb * 2**20]
        return max(below, key=lambda r: r["bytes"])["busbw_GBps"] / peak if below and peak else None

    advice: BucketAdvice = {
        "peak_busbw_GBps": peak,
        "knee_bytes": knee["bytes"] if knee else None,
        "default_fraction_of_peak": at(DDP_BUCKET_MB),
        "first_bucket_fraction_of_peak": at(DDP_FIRST_BUCKET_MB),
    }
    if knee is None or peak <= 0:
        advice["text"] = "no all_reduce measurement to judge DDP's bucket size by"
        return advice
    suggested = max(1, -(-knee["bytes"] // 2**20))  # MiB, rounded up
    advice["suggested_bucket_cap_mb"] = suggested
    measured_up_to = max(row["bytes"] for row in rows)
    if measured_up_to < DDP_BUCKET_MB * 2**20:
        verdict = (
            f"sizes up to {_mib(measured_up_to)} were measured, too few to judge DDP's default of "
            f"{DDP_BUCKET_MB} MB (run up to at least 32M)"
        )
    elif suggested <= DDP_BUCKET_MB:
        verdict = (
            f"DDP's default bucket_cap_mb={DDP_BUCKET_MB} is past the knee "
            f"({advice['default_fraction_of_peak']:.0%} of peak): the default is fine; down to "
            f"bucket_cap_mb={suggested} would keep the bandwidth and start communicating sooner"
        )
    else:
        verdict = (
            f"DDP's default bucket_cap_mb={DDP_BUCKET_MB} reaches only "
            f"{advice['default_fraction_of_peak']:.0%} of peak: bucket_cap_mb={suggested} would "
            f"help a model with more than {DDP_BUCKET_MB} MB of gradients (a smaller one fits in "
            "one bucket whatever the cap), at the price of starting each step's first all-reduce "
            "later in backward"
        )
    advice["text"] = (
        f"all_reduce reaches {KNEE:.0%} of its peak busbw ({peak:.2f} GB/s) from "
        f"{_mib(knee['bytes'])}; {verdict}."
    )
    if advice["first_bucket_fraction_of_peak"] is not None:
        advice["text"] += (
            f" DDP's first bucket ({DDP_FIRST_BUCKET_MB} MB) runs at "
            f"{advice['first_bucket_fraction_of_peak']:.0%} of peak."
        )
    return advice


def reading_lines(result: CommResult) -> list[str]:
    reading, limits = result["analysis"], result.get("ceilings") or {}
    lines = []
    if limits:
        lines.append(
            "ceilings: "
            + "; ".join(
                f"{CEILINGS.get(key, key)} {value:.2f} GB/s" for key, value in limits.items()
            )
        )
    for op, entry in reading["ops"].items():
        text = f"{op}: peak busbw {entry['peak_busbw_GBps']:.2f} GB/s"
        if entry["large_busbw_GBps"] is not None:
            text += f", {entry['large_busbw_GBps']:.2f} GB/s at >= {_mib(LARGE)}"
            ratios = [
                f"{ratio:.2f}x {CEILINGS.get(key, key)}"
                for key, ratio in entry["large_vs_ceilings"].items()
                if key != "memcpy_1thread_GBps"
            ]
            if ratios:
                text += " = " + ", ".join(ratios)
        lines.append(text)
    if "bucket" in reading:
        lines.append("DDP buckets: " + reading["bucket"]["text"])
    if "harness" in result:
        h = result["harness"]
        lines.append(
            f"harness overhead on a 4-byte all_reduce: {h['harness_us']:.1f} us per call against "
            f"{h['bare_us']:.1f} us in a bare loop (median of {h['rounds']} paired rounds: "
            f"{h['overhead']:+.1%})"
        )
    return lines


def table(result: CommResult) -> str:
    s = result["settings"]
    lines = [
        f"# rankwise comm bench: {result['world_size']} ranks ({result['nnodes']} node(s)) on "
        f"{result['backend']} ({result['device']}), {s['dtype']}, {s['iters']} iterations after "
        f"{s['warmup']} warm-up; time = slowest rank, median and p90"
    ]
    for op in dict.fromkeys(row["op"] for row in result["results"]):
        lines += ["", f"# {op}", "#" + HEADER[1:]]
        for row in (r for r in result["results"] if r["op"] == op):
            lines.append(
                f"{row['bytes']:>12} {row['count']:>11} {row['dtype']:>9} {row['time_us']:>10.1f} "
                f"{row['p90_us']:>10.1f} {row['algbw_GBps']:>12.3f} {row['busbw_GBps']:>12.3f} "
                f"{row['wrong']:>7}"
            )
    return "\n".join(lines + [""] + [f"# {line}" for line in reading_lines(result)])


def markdown(result: CommResult) -> str:
    m, s = result["machine"], result["settings"]
    lines = (
        [
            f"# rankwise comm bench — {result['world_size']} ranks on {result['backend']}",
            "",
            f"torch {m['torch']}, {m['cpu']}, {m['cores']} cores; {result['nnodes']} node(s); "
            f"{s['dtype']}; {s['iters']} timed calls after {s['warmup']} warm-up per size; a "
            "call's time is the slowest rank's.",
            "",
            "## Reading",
            "",
        ]
        + [f"- {line}" for line in reading_lines(result)]
        + ["", "## Measurements"]
    )
    for op in dict.fromkeys(row["op"] for row in result["results"]):
        lines += [
            "",
            f"### {op} (busbw = algbw x {_factor(result, op):.3g})",
            "",
            "| size | count | time (us) | p90 (us) | algbw (GB/s) | busbw (GB/s) | #wrong |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in (r for r in result["results"] if r["op"] == op):
            lines.append(
                f"| {_mib(row['bytes'])} | {row['count']} | {row['time_us']:.1f} | "
                f"{row['p90_us']:.1f} | {row['algbw_GBps']:.3f} | {row['busbw_GBps']:.3f} | "
                f"{row['wrong']} |"
            )
    return "\n".join(lines) + "\n"


def _factor(result: CommResult, op: str) -> float:
    return next(row["factor"] for row in result["results"] if row["op"] == op)


def plot(result: CommResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(10, 6))
    for op in dict.fromkeys(row["op"] for row in result["results"]):
        rows = [r for r in result["results"] if r["op"] == op]
        axis.plot(
            [r["bytes"] for r in rows],
            [r["busbw_GBps"] for r in rows],
            marker="o",
            markersize=3,
            label=op,
        )
    for (key, value), style in zip(
        (result.get("ceilings") or {}).items(),
        ("--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))),
    ):
        axis.axhline(
            value,
            color="grey",
            linestyle=style,
            linewidth=1.2,
            label=f"{CEILINGS.get(key, key)} {value:.2f}",
        )
    axis.set_xscale("log", base=2)
    axis.set_xlabel("message size (bytes)")
    axis.set_ylabel("busbw (GB/s)")
    axis.set_title(
        f"rankwise comm bench: {result['world_size']} ranks, {result['backend']}, "
        f"{result['settings']['dtype']}"
    )
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write(result: CommResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "comm.json", out / "comm.md", out / "comm.png"]
    write_text_atomic(paths[0], json.dumps(result, indent=2))
    write_text_atomic(paths[1], markdown(result))
    plot(result, paths[2])
    return paths
