"""``rankwise bench``'s outputs: the table, ``report.md``, ``report.json`` (every number) and
``report.png``."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rankwise.checkpoint import write_text_atomic
from rankwise.tools.bench import why
from rankwise.tools.bench.equivalence import UNDECIDED, VERDICT_CELLS
from rankwise.tools.bench.records import (
    BenchRow,
    BenchSummary,
    PairedRatio,
    Reading,
    RowRecord,
    RunResult,
)

ACCURACY_POINTS = 0.01
"""A row's test accuracy may differ from ``single``'s by this much (one point)."""


EXIT_COULD_NOT_RUN = 4
"""``rankwise bench``'s exit code when a row or its check could not run and none failed a check
(which exits 1)."""


def median(runs: list[RunResult], key: str, digits: int = 2) -> float | None:
    """The median of ``key`` over the runs that have it (rounded), or None."""
    values = [run[key] for run in runs if run.get(key) is not None]
    return round(statistics.median(values), digits) if values else None


def significant(value: float | None, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant figures: a CPU's 0.0028 TFLOP/s keeps its precision (4
    decimals made it 0.0028 from 0.002832, 1 % off the MFU computed from it)."""
    return None if value is None else float(f"{value:.{digits}g}")


def run_line(row: str, repeat: int, repeats: int, run: dict) -> str:
    """One finished run, for a log (after ``bench [3/8]``): ``ddp (repeat 1/2): 21.0 s, 534.0
    samples/s``; a run that could not run points to the table's notes, which carry its error
    once."""
    outcome = (
        "could not run (why: under the table)"
        if "error" in run
        else f"{run.get('steady_samples_per_s') or run.get('samples_per_s')} samples/s"
    )
    return f"{row} (repeat {repeat + 1}/{repeats}): {run['wall_s']} s, {outcome}"


def summarize(records: list[RowRecord], meta: dict[str, Any]) -> BenchSummary:
    """One line per row (medians over repeats), the reading, and everything measured."""
    ok = {r["row"]: [run for run in r["runs"] if "error" not in run] for r in records}
    reference = median(ok.get("single", []), "steady_samples_per_s")
    single_accuracy = ok["single"][0]["accuracy"] if ok.get("single") else None
    lines: list[BenchRow] = []
    for record in records:
        runs = ok[record["row"]]
        line: BenchRow = {
            "row": record["row"],
            "about": record["about"],
            "processes": record["processes"],
            "threads": record["threads"],
            "tolerance": record["tolerance"],
            "status": "",  # (set below)
        }
        if record["missing"]:
            line["status"] = f"not installed: {record['missing']}"
        elif not runs:
            line["status"] = "could not run" if record["runs"] else "not run"
            if record["runs"]:  # the error once, under the table
                line["reason"] = record["runs"][0]["error"]
        else:
            first = runs[0]
            speed = median(runs, "steady_samples_per_s")
            line |= {
                "status": "ok",
                "wall_s": median(runs, "wall_s"),
                "samples_per_s": speed,
                "tokens_per_s": median(runs, "tokens_per_s"),
                "tflops_per_s": significant(median(runs, "tflops_per_s", 12)),
                "mfu": median(runs, "mfu", 4),
                "mfu_datasheet": median(runs, "mfu_datasheet", 4),
                "speedup": round(speed / reference, 3) if speed and reference else None,
                "peak_rss_mb": [peak for peak, _ in first["peak_rss_mb"]],
                "accuracy": first["accuracy"],
                "macro_f1": first["macro_f1"],
                "eval_samples": first["eval_samples"],
                "eval_expected": record["eval_expected"],
                "eval_count_ok": record["eval_count_ok"],
                "accuracy_ok": (
                    single_accuracy is not None
                    and abs(first["accuracy"] - single_accuracy) <= ACCURACY_POINTS
                ),
                # The equivalence check by its criterion (tools/bench/equivalence.py): verdict,
                # reason, differences.
                "criterion": None,
                "verdict": None,
                "equivalent": None,
                "reason": None,
                "max_param_diff": None,
            }
            line |= record.get("equivalence", {})
            line |= why.summary(first.get("breakdown"))
        lines.append(line)
    return {"rows": lines, "reading": reading(lines, ok), "meta": meta, "runs": records}


def _paired_ratio(ok: dict[str, list[RunResult]], a: str, b: str) -> PairedRatio | None:
    """Median over repeats of a's throughput / b's (runs of one repeat are neighbours: a pair)."""
    pairs = [
        (x["steady_samples_per_s"], y["steady_samples_per_s"])
        for x, y in zip(ok.get(a, []), ok.get(b, []))
        if x.get("steady_samples_per_s") and y.get("steady_samples_per_s")
    ]
    if not pairs:
        return None
    return {
        "median": round(statistics.median(x / y for x, y in pairs), 3),
        "pairs": [round(x / y, 3) for x, y in pairs],
    }


def reading(lines: list[BenchRow], ok: dict[str, list[RunResult]]) -> Reading:
    measured = [line for line in lines if line["status"] == "ok"]
    passing = [
        line
        for line in measured
        if line["equivalent"] and line["eval_count_ok"] and line["accuracy_ok"]
    ]
    fastest = max(passing, key=lambda line: line["samples_per_s"] or 0, default=None)
    return {
        "fastest_passing": fastest["row"] if fastest else None,
        "fastest_passing_speedup": fastest["speedup"] if fastest else None,
        "ddp_vs_plain_ddp": _paired_ratio(ok, "ddp", "plain-ddp"),
        "ddp_vs_plain_accelerate": _paired_ratio(ok, "ddp", "plain-accelerate"),
        "plain_ddp_vs_per_step_sync": _paired_ratio(ok, "plain-ddp", "per-step-sync"),
        "scaling_efficiency": scaling_efficiency(measured),
        # a check that ran and failed: equivalence (FAIL, or FAIL unchecked), the count, accuracy
        "failing": [
            line["row"]
            for line in measured
            if line["equivalent"] is False
            or line["verdict"] == "unchecked"
            or not line["eval_count_ok"]
            or not line["accuracy_ok"]
        ],
        # Rows the report cannot vouch for: not measured, or measured with a check that could not
        # run or could not judge -- never counted among the passing ones.
        "not_run": [
            line["row"]
            for line in lines
            if line["status"] != "ok" or line["verdict"] in UNDECIDED or line["verdict"] is None
        ],
        "unchecked": {
            line["row"]: line["verdict"] or "no check"
            for line in measured
            if line["verdict"] in UNDECIDED or line["verdict"] is None
        },
    }


def exit_code(reading: Reading) -> int:
    """``rankwise bench``'s exit status from what its reading says: 1 when a row failed a check,
    else 4 when a row, or a row's check, could not run (or could not judge), else 0."""
    if reading["failing"]:
        return 1
    return EXIT_COULD_NOT_RUN if reading["not_run"] else 0


def scaling_efficiency(measured: list[BenchRow]) -> dict[str, float]:
    """Each multi-process row's throughput / (the cores it used x one process on one thread), when
    ``single-1t`` ran.  Cores are processes x threads: on C cores a row of N ranks runs C/N threads
    each, so dividing by N alone credited the ranks' threads to the scaling (on 16 cores, 2 ranks x
    8 threads counted as 2 cores)."""
    base = next((line["samples_per_s"] for line in measured if line["row"] == "single-1t"), None)
    if not base:
        return {}
    return {
        line["row"]: round(
            line["samples_per_s"] / (line["processes"] * line.get("threads", 1) * base), 3
        )
        for line in measured
        if line["processes"] > 1 and line["samples_per_s"]
    }


def _check(value: bool | None) -> str:
    return "—" if value is None else ("pass" if value else "FAIL")


def table(summary: BenchSummary) -> str:
    """The Markdown table (also what the terminal shows)."""
    head = (
        "| row | procs × threads | wall s | samples/s | tokens/s | TFLOP/s | MFU | speedup | peak "
        "RSS MB/rank | step ms: compute · comm · data · sync · wait | accuracy | macro-F1 | eval "
        "count | Δgradient (tol) | Δweights (tol) | equivalent | criterion |"
    )
    out = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|---|---|---|---|"]
    for line in summary["rows"]:
        if line["status"] != "ok":
            out.append(
                f"| {line['row']} | {line['processes']} × {line['threads']} | | | | | | | | | | | "
                f"| | | {line['status']} | |"
            )
            continue
        count = f"{line['eval_samples']}/{line['eval_expected']} {_check(line['eval_count_ok'])}"
        speedup = f"{line['speedup']:.2f}×" if line["speedup"] else "—"
        tokens = f"{line['tokens_per_s']:,.0f}" if line["tokens_per_s"] else "—"
        # (no steady step: every epoch ended within its warm-up steps; the note says so)
        speed = f"{line['samples_per_s']:,.0f}" if line["samples_per_s"] else "—"
        out.append(
            f"| {line['row']} | {line['processes']} × {line['threads']} | {line['wall_s']:.1f} | "
            f"{speed} | {tokens} | {tflops_cell(line)} | {mfu_cell(line)} | "
            f"{speedup} | {', '.join(f'{p:.0f}' for p in line['peak_rss_mb'])} | "
            f"{why.step_cell(line.get('steps'))} | {line['accuracy']:.4f} | {line['macro_f1']:.4f} "
            f"| {count} | {_difference(line, 'max_gradient_diff', 'gradient_tolerance')} | "
            f"{_difference(line, 'max_param_diff', 'tolerance')} | "
            f"{CELLS.get(line['verdict'] or '', '—')} | "
            f"{CRITERIA.get(line['criterion'] or '', '—')} |"
        )
    notes = [f"- {line['row']}: {line['reason']}" for line in summary["rows"] if line.get("reason")]
    notes += [
        f"- {line['row']}: no throughput: no step was steady (every epoch ended within the "
        "warm-up and profiled steps); give more data or more steps per epoch"
        for line in summary["rows"]
        if line["status"] == "ok" and not line["samples_per_s"]
    ]
    notes += [
        f"- {line['row']}, criterion: {line['criterion_note']}"
        for line in summary["rows"]
        if line.get("criterion_note")
    ]
    notes += why.notes(summary["rows"])
    return "\n".join(out + ([""] + notes if notes else []))


CRITERIA = {
    "reference": "reference",
    "lockstep": "lockstep (verify)",
    "weights": "weights (dropout 0)",
}
"""The table's criterion cell (tools/bench/equivalence.py)."""
CELLS = {**VERDICT_CELLS, "could not run": "could not run"}
"""The equivalence cell (the criterion cell beside it says which check could not run)."""


def _difference(line: Mapping[str, object], key: str, limit: str) -> str:
    value = line.get(key)
    return "—" if value is None else f"{value:.1e} ({line[limit]:.0e})"


def tflops_cell(line: BenchRow) -> str:
    value = line.get("tflops_per_s")
    return f"{value:.3g}" if value else "—"


def mfu_cell(line: BenchRow) -> str:
    """Against the peak measured in the run; the datasheet's after a slash on known GPUs."""
    mfu = line.get("mfu")
    if mfu is None or mfu > 1:  # (a share above the peak: the peak was not measured)
        return "—"
    if mfu < 0.001:
        return "<0.1%"  # a toy model on a CPU
    datasheet = line.get("mfu_datasheet")
    sheet = f" / {datasheet:.1%}" if datasheet and datasheet <= 1 else ""
    return f"{mfu:.1%}{sheet}"


def reading_text(summary: BenchSummary) -> str:
    r, meta = summary["reading"], summary["meta"]
    said = []
    if r["fastest_passing"]:
        said.append(
            f"Fastest row that passes every check: **{r['fastest_passing']}** "
            f"({r['fastest_passing_speedup']:.2f}× `single` at {meta['cores']} cores)."
        )
    for ratio, text in (
        (r["ddp_vs_plain_ddp"], "rankwise `ddp` / hand-written DDP loop"),
        (r["ddp_vs_plain_accelerate"], "rankwise `ddp` / plain Accelerate"),
        (r["plain_ddp_vs_per_step_sync"], "hand-written DDP / per-step-sync loop"),
    ):
        if ratio and len(ratio["pairs"]) == 1:
            said.append(
                f"{text}: {ratio['median']:.3f} from one pair only: run to run noise is about ±15 "
                "% on 2 cores, so this says little; `make bench` (alternating repeats) gives the "
                "real figure."
            )
        elif ratio:
            said.append(
                f"{text}: {ratio['median']:.3f} (median of {len(ratio['pairs'])} alternating "
                f"pair(s): {', '.join(str(p) for p in ratio['pairs'])})."
            )
    if r.get("scaling_efficiency"):
        said.append(
            "Scaling efficiency (throughput / (processes × threads × `single-1t`)): "
            + ", ".join(f"{row} {value:.2f}" for row, value in r["scaling_efficiency"].items())
            + "."
        )
    unchecked = r.get("unchecked", {})
    not_measured = [row for row in r["not_run"] if row not in unchecked]
    if r["failing"]:
        said.append(f"Failing a check: {', '.join(r['failing'])}.")
    elif not r["not_run"]:
        said.append(
            "Every row ran and passes its equivalence check, the evaluation count and accuracy "
            "within 1 point of `single`."
        )
    if unchecked:
        said.append(
            "Not checked: "
            + ", ".join(f"{row} (equivalence {verdict})" for row, verdict in unchecked.items())
            + ": their numbers stand, but nothing here says they compute what one process does "
            "(why: under the table)."
        )
    if not_measured:
        said.append(f"Not measured: {', '.join(not_measured)} (see the table).")
    return "\n".join(f"- {line}" for line in said)


def markdown(summary: BenchSummary) -> str:
    meta = summary["meta"]
    return "\n".join(
        [
            f"# rankwise bench — {meta['preset']} preset",
            "",
            f"{meta['data']} · model {meta['model']} · {meta['steps']} steps × batch "
            f"{meta['batch_size']} · {meta['nproc']} processes · {meta['repeats']} repeat(s) · the "
            "app's stock settings (dropout on) · equivalence over the first "
            f"{meta['equivalence_step']} steps against one process",
            "",
            f"Machine: {meta['cpu']}, {meta['cores']} cores, GPU {meta['cuda'] or 'none'}; torch "
            f"{meta['torch']}, python {meta['python']}; "
            + ", ".join(f"{k} {v}" for k, v in meta["libraries"].items()),
            "",
            table(summary),
            "",
            "samples/s and tokens/s: training only, after the warm-up steps (checkpoints and "
            "evaluation left out); TFLOP/s: the model's FLOPs (torch's FLOP counter, forward and "
            "backward) per second, all ranks together; MFU: that over the matrix-product peak "
            "measured in the same run at the run's dtype (all ranks), and over the datasheet peak "
            "after a slash on known GPUs; speedup: against `single` at the same total cores; peak "
            "RSS: each rank's resident memory during training; eval count: predictions gathered "
            "against the split size; equivalence by the row's criterion: lockstep (`rankwise "
            "verify` of the built-in app under the row's strategy, dropout off, one process "
            "following it step by step: Δgradient relative to the gradient, Δweights after each "
            "step) or, for a row verify cannot run or judge (the reason is under the table), "
            "weights (the largest parameter difference from `single` after the same first steps, "
            "in separate untimed runs with dropout 0, judged against the row's stated tolerance).",
            "",
            "## Reading",
            "",
            reading_text(summary),
            "",
        ]
    )


def plot(summary: BenchSummary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [line for line in summary["rows"] if line["status"] == "ok"]
    names = [line["row"] for line in lines]
    colour = [
        "#2b8a3e" if line["equivalent"] and line["eval_count_ok"] else "#c92a2a" for line in lines
    ]
    figure, axes = plt.subplots(1, 6, figsize=(28, 0.45 * len(lines) + 2), sharey=True)
    panels = (
        ("samples_per_s", "training samples/s"),
        ("speedup", "speedup vs single (equal cores)"),
        ("mfu", "MFU (of the measured peak)"),
        ("accuracy", "test accuracy"),
        ("peak_rss_mb", "peak RSS MB (largest rank; every rank's)"),
    )
    for axis, (key, title) in zip(axes, panels):
        columns: list[Mapping[str, Any]] = list(lines)
        values = [
            max(line[key]) if key == "peak_rss_mb" and line[key] else line[key] for line in columns
        ]
        axis.barh(names, [value or 0 for value in values], color=colour)
        axis.set_title(title)
        for y, (line, value) in enumerate(zip(lines, values)):
            axis.text(value or 0, y, " " + _bar_label(key, value, line), va="center", fontsize=8)
        axis.margins(x=0.2)
    why.plot_rows(axes[5], lines)
    axes[0].invert_yaxis()  # the table's order, top to bottom (the axes share it)
    axes[1].axvline(1.0, color="grey", linestyle="--", linewidth=1)
    if lines and lines[0]["row"] == "single":
        axes[3].axvline(lines[0]["accuracy"], color="grey", linestyle="--", linewidth=1)
    meta = summary["meta"]
    figure.suptitle(
        f"rankwise bench ({meta['preset']}): {meta['data']}, {meta['nproc']} processes, "
        f"{meta['cores']} cores — green: passes equivalence and count checks, red: fails"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _bar_label(key: str, value: float | None, line: BenchRow) -> str:
    """A panel's number: "—" where the row has none (no FLOPs counted: not an MFU of 0)."""
    if value is None:
        return "—"
    if key == "mfu":
        return f"{value:.1%}"
    if key == "peak_rss_mb":
        return ", ".join(f"{peak:.0f}" for peak in line["peak_rss_mb"])
    return f"{value:.0f}" if key == "samples_per_s" else f"{value:.2f}"


def write(summary: BenchSummary, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "report.md", "json": out / "report.json", "png": out / "report.png"}
    write_text_atomic(paths["json"], json.dumps(summary, indent=2, default=str))
    write_text_atomic(paths["md"], markdown(summary))
    plot(summary, paths["png"])
    return paths
