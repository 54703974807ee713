"""``rankwise bench --script``'s report: the table with its notes, report.md/json and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

from rankwise.checkpoint import write_text_atomic
from rankwise.measure.throughput import MIN_WINDOW_S
from rankwise.tools.bench import why
from rankwise.tools.bench.equivalence import VERDICT_CELLS
from rankwise.tools.bench.report import mfu_cell, tflops_cell


def _difference(value: float | None, limit: float | None) -> str:
    return "—" if value is None else f"{value:.1e} ({limit:.0e})"


def table(summary: dict) -> str:
    out = [
        "| row | procs | samples/s | speedup | TFLOP/s | MFU | peak RSS MB/rank | step ms: "
        "compute · comm · data · sync · wait | Δgradient (tol) | Δweights (tol) | equivalent |",
        "|---|---:|---:|---:|---:|---:|---|---|---|---|---|",
    ]
    for line in summary["rows"]:
        if line["status"] != "ok":
            out.append(
                f"| {line['row']} | {line['processes']} | | | | | | | | | {line['status']} |"
            )
            continue
        verdict = VERDICT_CELLS.get(line["verdict"], "—")
        speedup = f"{line['speedup']:.2f}×" if line["speedup"] else "—"
        speed = "—" if line["samples_per_s"] is None else f"{line['samples_per_s']:,.0f}"
        if line["samples_per_s"] is not None and line.get("spread") is not None:
            speed += f" ±{line['spread'] / 2:.0%}"  # half the spread over the repeats
        if line.get("disturbed"):
            speed += " (disturbed)"
        out.append(
            f"| {line['row']} | {line['processes']} | {speed} | {speedup} | {tflops_cell(line)} | "
            f"{mfu_cell(line)} | {', '.join(f'{p:.0f}' for p in line['peak_rss_mb'])} | "
            f"{why.step_cell(line.get('steps'))} | "
            f"{_difference(line.get('max_gradient_diff'), line.get('gradient_tolerance'))} | "
            f"{_difference(line.get('max_param_diff'), line.get('tolerance'))} | {verdict} |"
        )
    compared = [line for line in summary["rows"] if line.get("compared")]
    notes = []
    if compared:
        notes.append(
            "throughput: the script as written; equivalence: `rankwise verify` of each row, "
            f"{compared[0]['compared_steps']} steps with {compared[0]['compared']}, one process "
            "following the row in lockstep (its weights before each step, its gradient applied)"
        )
    notes += _window_notes(summary["rows"], summary.get("min_window_s", MIN_WINDOW_S))
    if any(line.get("tflops_per_s") for line in summary["rows"]):
        notes.append(
            "TFLOP/s: the model FLOPs torch's counter saw in each row's first step (forward and "
            "backward, a warm-up step), per sample, times samples/s; MFU: that over the "
            "matrix-product peak the row's ranks measured after their window at the step's dtype "
            "(and / the datasheet's, on a known GPU)"
        )
    uncounted = sorted(
        {
            line["flops_counted"]
            for line in summary["rows"]
            if line.get("flops_counted") and line["flops_counted"] != "first step"
        }
    )
    notes += [f"no TFLOP/s: {reason}" for reason in uncounted]
    notes += why.notes(summary["rows"])
    notes += [
        f"- {line['row']}: {line['reason']}" for line in summary["rows"] if line.get("reason")
    ]
    notes += [
        f"- {line['row']}: disturbed, not a figure to trust ({line['disturbed']}): left out of the "
        "fastest; rerun the bench on a quiet machine"
        for line in summary["rows"]
        if line.get("disturbed")
    ]
    notes += [f"- {note}" for note in summary.get("notes", [])]
    if summary.get("fastest"):
        notes.append(f"fastest row that passes: {summary['fastest']}")
    elif summary.get("fastest_undecided"):
        notes.append(
            f"fastest row: undecided, {', '.join(summary['fastest_undecided'])} passed but was "
            "disturbed, and no slower row takes its place; rerun the bench on a quiet machine"
        )
    return "\n".join(out + ([""] + notes if notes else []))


def _window_notes(rows: list[dict], min_window_s: float) -> list[str]:
    timed = [line for line in rows if line.get("window_s")]
    if not timed:
        return []
    notes = [
        "throughput window per run (median): "
        + ", ".join(
            f"{line['row']} {line['window_s']:.2f} s over {line['timed_steps']:.0f} steps"
            + (
                f" ({line['pooled_runs']} runs of the script pooled)"
                if line["pooled_runs"] > 1
                else ""
            )
            for line in timed
        )
        + (
            f"; at least {min_window_s:g} s where the script trains that long"
            if min_window_s > 0
            else "; no least window (--min-window 0)"
        )
        + (
            "; ± is half the spread over the repeats"
            if any(line.get("spread") is not None for line in timed)
            else "; one run per row: --repeats 3 shows the spread"
        )
    ]
    notes += [
        f"- {line['row']}: "
        + ("the script ended before" if line["script_ended"] else "timed over less than")
        + f" a {min_window_s:g} s window ({line['window_s']:.2f} s over {line['timed_steps']:.0f} "
        "steps"
        + (f", {line['pooled_runs']} runs" if line["pooled_runs"] > 1 else "")
        + "): its samples/s is noisy"
        + (
            "; script arguments that train longer give a steadier figure"
            if line["script_ended"]
            else ""
        )
        for line in timed
        if line["window_short"]
    ]
    return notes


def write(summary: dict, meta: dict, out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {"md": out / "report.md", "json": out / "report.json", "png": out / "report.png"}
    write_text_atomic(
        paths["md"], f"# rankwise bench --script {meta['script']}\n\n{table(summary)}\n"
    )
    write_text_atomic(paths["json"], json.dumps({**summary, "meta": meta}, indent=2, default=str))
    measured = [line for line in summary["rows"] if line["status"] == "ok"]
    broken_down = [line for line in measured if line.get("breakdown")]
    figure, axes = plt.subplots(
        1, 2 if broken_down else 1, figsize=(14 if broken_down else 7, 3.5), squeeze=False
    )
    axis = axes[0][0]
    axis.bar(
        [line["row"] for line in measured],
        [line["samples_per_s"] or 0 for line in measured],
        color=[
            {
                "not equivalent": "tab:red",
                "could not run": "tab:red",
                "not comparable": "tab:gray",
            }.get(line.get("verdict"), "tab:green")
            for line in measured
        ],
    )
    axis.set_ylabel("samples/s (steady)")
    axis.set_title(
        f"{Path(meta['script']).name}: red = not equivalent to single, grey = not comparable"
    )
    if broken_down:
        why.plot(axes[0][1], broken_down)
    figure.tight_layout()
    figure.savefig(paths["png"], dpi=120)
    plt.close(figure)
    return paths
