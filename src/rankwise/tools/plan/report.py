"""``rankwise plan``'s outputs: the terminal table, plan.md and plan.json."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from rankwise.checkpoint import write_text_atomic
from rankwise.tools.plan.planner import Plan, Row
from rankwise.tools.plan.rank_memory import KINDS
from rankwise.tools.plan.records import PlanRowJSON

COLUMNS = (
    "strategy",
    "ranks",
    "rows",
    "params",
    "grads",
    "optim",
    "activ.",
    "buffers",
    "peak",
    "fits",
    "comm/step",
    "compute",
    "exposed comm",
    "step",
)


def size(nbytes: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            value = nbytes / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{nbytes:.0f} B"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def cells(row: Row) -> list[str]:
    memory, time = row.memory, row.time
    comm = sum(call.nbytes for call in row.collectives)
    return [
        row.strategy + (" +ckpt" if row.checkpointing else ""),
        str(row.world_size),
        str(row.rows),
        size(memory.parameters),
        size(memory.gradients),
        size(memory.optimizer),
        size(memory.activations),
        size(memory.buffers),
        size(memory.peak),
        "yes" if row.fits else "NO",
        size(comm) if comm else "-",
        ms(time.compute_s + time.optimizer_s),
        ms(time.exposed_comm_s),
        ms(time.total_s),
    ]


def table(plan: Plan) -> str:
    rows = [list(COLUMNS)] + [cells(row) for row in plan.rows]
    widths = [max(len(line[i]) for line in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths))
        )
        for line in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + [""] + summary(plan))


def summary(plan: Plan) -> list[str]:
    """The reading: the device, the fastest strategy that fits at each world size, and each misfit's
    fix."""
    device = plan.device
    lines = [
        f"device: {device.name}, {size(device.memory_bytes)} a rank, {size(plan.limit)} usable "
        f"({plan.config.headroom:.0%} headroom); compute at {device.efficiency:.0%} of "
        f"{device.peak(plan.config.precision != '32-true') / 1e12:.3g} TFLOP/s ({device.source}) "
        "unless timed here"
    ]
    if plan.config.comm is not None:
        lines.append("links: " + plan.bandwidth.source)
    else:
        from rankwise.tools.plan.comms import from_device

        by_link: dict[str, list[str]] = {}
        for world, nodes in plan.nodes.items():
            if world > 1:
                by_link.setdefault(from_device(device, nodes).source, []).append(str(world))
        lines += [
            f"links at {', '.join(worlds)} ranks: {source}" for source, worlds in by_link.items()
        ]
    for world in plan.config.world_sizes:
        best = plan.fastest(world)
        others = [row for row in plan.ties(world) if row is not best]
        tied = (
            "; tied within the timing noise: "
            + ", ".join(
                f"{row.strategy} ({ms(row.time.total_s)} ±{row.time.noise:.0%})" for row in others
            )
            if others
            else ""
        )
        lines.append(
            f"{world} ranks: fastest that fits: {best.strategy} ({ms(best.time.total_s)} a step, "
            f"{size(best.memory.peak)} a rank){tied}"
            if best
            else f"{world} ranks: nothing planned fits"
        )
    for row in plan.rows:
        if not row.fits and row.change:
            lines.append(
                f"{row.strategy} at {row.world_size} ranks does not fit ({size(row.memory.peak)} > "
                f"{size(plan.limit)}); cheapest change: {row.change}"
            )
    return lines + plan.notes


def as_json(plan: Plan) -> dict:
    capture = plan.capture
    return {
        "script": capture.source,
        "device": asdict(plan.device),
        "limit_bytes": plan.limit,
        "config": {
            key: str(value) if isinstance(value, Path) else value
            for key, value in asdict(plan.config).items()
        },
        "model": {
            "parameters": sum(p.numel() for p in capture.model.parameters() if p.requires_grad),
            "class": type(capture.model).__name__,
            "optimizer": type(capture.optimizer).__name__,
            "grad_accum": capture.grad_accum,
            "global_batch": capture.global_batch,
        },
        "bandwidth": {"source": plan.bandwidth.source, "busbw_Bps": plan.bandwidth.busbw},
        "nodes": plan.nodes,
        "rows": [row_json(row) for row in plan.rows],
        "fastest": {
            str(world): (best.strategy if (best := plan.fastest(world)) else None)
            for world in plan.config.world_sizes
        },
        "ties": {
            str(world): [row.strategy for row in plan.ties(world)]
            for world in plan.config.world_sizes
        },
        "notes": plan.notes,
        "elapsed_s": plan.elapsed_s,
        "peak_rss_mb": plan.peak_rss_mb,
    }


def row_json(row: Row) -> PlanRowJSON:
    memory, time = row.memory, row.time
    return {
        "strategy": row.strategy,
        "world_size": row.world_size,
        "rows": row.rows,
        "precision": row.precision,
        "checkpointing": row.checkpointing,
        "fits": row.fits,
        "change": row.change,
        "memory": {
            "parameters": memory.parameters,
            "gradients": memory.gradients,
            "optimizer": memory.optimizer,
            "activations": memory.activations,
            "buffers": memory.buffers,
            "peak": memory.peak,
            "at_peak": memory.at_peak,
            "source": memory.source,
            "notes": memory.notes,
        },
        "collectives": [
            {
                "op": call.op,
                "nbytes": call.nbytes,
                "calls": call.calls,
                "overlapped": call.overlapped,
                "what": call.what,
            }
            for call in row.collectives
        ],
        "time": {
            "compute_s": time.compute_s,
            "optimizer_s": time.optimizer_s,
            "comm_s": time.comm_s,
            "exposed_comm_s": time.exposed_comm_s,
            "flops": time.flops,
            "efficiency": time.efficiency,
            "overlap": time.overlap,
            "total_s": time.total_s,
            "noise": time.noise,
        },
    }


def markdown(plan: Plan) -> str:
    header = "| " + " | ".join(COLUMNS) + " |"
    lines = [
        f"# rankwise plan: {plan.capture.source}",
        "",
        f"Per rank; peak = {' + '.join(KINDS)} at the step's peak; params, grads and optim are "
        "what a rank keeps, activations and buffers what it holds at the peak.",
        "",
        header,
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in plan.rows]
    lines += ["", "## Reading", ""] + [f"- {line}" for line in summary(plan)]
    lines += ["", "## How each row was obtained", ""]
    for row in plan.rows:
        lines.append(
            f"- {row.strategy} at {row.world_size} ranks: memory {row.memory.source}; overlap: "
            f"{row.time.overlap}; compute efficiency {row.time.efficiency:.1%}"
        )
        for call in row.collectives:
            lines.append(
                f"    - {call.op} of {call.what}: {size(call.nbytes)} a step in {call.calls} "
                "call(s)"
            )
    return "\n".join(lines) + "\n"


def write(plan: Plan, out: Path) -> list[Path]:
    from rankwise.tools.plan.memory_plot import plot

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "plan.md", out / "plan.json", out / "plan.png"]
    write_text_atomic(paths[0], markdown(plan))
    write_text_atomic(paths[1], json.dumps(as_json(plan), indent=2))
    plot(plan, paths[2])
    return paths
