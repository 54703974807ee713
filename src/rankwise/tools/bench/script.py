"""``rankwise bench --script``: a user's own script, unchanged, under each strategy, against one process.

Each row runs ``rankwise launch --strategy NAME SCRIPT ARGS`` in fresh processes, in a scratch
directory (the script's own outputs land there), with the Runtime's probe switched on
(:mod:`rankwise.probe`): the script stops after ``--steps`` optimizer steps, having reported its
steady throughput, every rank's peak memory and its full fp32 parameters.  ``single`` always
runs first as the reference; every other row's parameters are compared with its parameters
after the same steps, against the stated tolerance, and a row that is not equivalent says
what in its model can make ranks differ.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rankwise.checkpoint import read_weights, write_text_atomic
from rankwise.errors import ConfigError
from rankwise.launch.choice import Choice
from rankwise.probe import DIRECTORY, STEPS, WARMUP
from rankwise.strategies import lookup, unavailable
from rankwise.tolerance import max_param_diff, tolerance
from rankwise.tools.bench.report import median, run_line
from rankwise.tools.harness import run_script
from rankwise.tools.verify.diagnose import batch_dependent

DEFAULT_STRATEGIES = ("ddp", "fsdp", "deepspeed-zero2", "accelerate")


@dataclass(frozen=True)
class ScriptRow:
    strategy: str
    processes: int

    def missing(self) -> str | None:
        return unavailable(self.strategy)


def rows_for(strategies: list[str], nproc: int) -> list[ScriptRow]:
    """``single`` first (the reference), then each named strategy at ``nproc`` processes (one-process ones at 1)."""
    names = ["single", *[name for name in strategies if name != "single"]]
    rows = []
    for name in names:
        try:
            processes = nproc if lookup(name).cls.multiprocess else 1
            Choice(name).check_launch(processes)  # each row runs under `rankwise launch --strategy NAME`
        except (ValueError, ConfigError) as e:
            raise ConfigError(f"--strategies: {e}") from None
        rows.append(ScriptRow(name, processes))
    return rows


def explain(facts: dict, world_size: int, difference: float, limit: float, device: str = "cpu") -> str:
    """Why a row is not equivalent, from what the probe saw in its model."""
    reasons = [f"max |Δparam| {difference:.1e} > tolerance {limit:.0e}"]
    if facts.get("batch_dependent"):
        reasons.append(batch_dependent(facts["batch_dependent"], world_size, device))
    if facts.get("dropout"):
        reasons.append(f"{', '.join(facts['dropout'])} with p > 0 draws other random masks on each rank: set the "
                       "dropout to 0 to compare")
    if len(reasons) == 1:
        reasons.append("nothing batch-dependent or random was seen in the model: look at the loss normalisation "
                       "under accumulation and at whether the data loader is rankwise's rank-sharded one")
    reasons.append("`rankwise verify` with this strategy shows the first step that differs and why")
    return "; ".join(reasons)


def run_bench(script: Path, script_args: list[str], rows: list[ScriptRow], *, steps: int, repeats: int,
              precision: str | None, out: Path, timeout_s: float = 900.0) -> dict:
    """Every row ``repeats`` times (alternating the order); the summary with one line per row."""
    script = script.resolve()
    runs: dict[str, list[dict]] = {row.strategy: [] for row in rows}
    runnable = [row for row in rows if row.missing() is None]
    total, done = len(runnable) * repeats, 0
    for repeat in range(repeats):
        for row in (runnable if repeat % 2 == 0 else runnable[::-1]):
            run_dir = out / "runs" / f"{row.strategy}-{repeat}"
            env = {DIRECTORY: str(run_dir.resolve()), STEPS: str(steps), WARMUP: str(max(1, steps // 4))}
            result = run_script(script, script_args, row.strategy, row.processes, run_dir, probe_env=env,
                                precision=precision, timeout_s=timeout_s)
            runs[row.strategy].append({**result, "run_dir": str(run_dir)})
            done += 1
            print(run_line(done, total, row.strategy, repeat, repeats, result), file=sys.stderr, flush=True)
    return summarize(rows, runs, precision)


def summarize(rows: list[ScriptRow], runs: dict[str, list[dict]], precision: str | None) -> dict:
    ok = {name: [run for run in row_runs if "error" not in run] for name, row_runs in runs.items()}
    reference = read_weights(Path(ok["single"][0]["run_dir"]) / "weights.safetensors") if ok.get("single") else None
    base_speed = median(ok.get("single", []), "steady_samples_per_s")
    lines = []
    for row in rows:
        line = {"row": row.strategy, "processes": row.processes}
        missing = row.missing()
        if missing:
            lines.append({**line, "status": f"not installed: {missing}"})
            continue
        good = ok[row.strategy]
        if not good:
            lines.append({**line, "status": f"failed: {runs[row.strategy][0]['error']}"})
            continue
        first = good[0]
        speed = median(good, "steady_samples_per_s")
        limit = tolerance(first["precision"])
        line |= {"status": "ok", "precision": first["precision"], "samples_per_s": speed,
                 "speedup": round(speed / base_speed, 3) if speed and base_speed else None,
                 "peak_rss_mb": first["peak_rss_mb"], "cuda_max_allocated_mb": first["cuda_max_allocated_mb"],
                 "wall_s": median(good, "wall_s"), "tolerance": limit, "max_param_diff": None,
                 "equivalent": None, "reason": None}
        if reference is None:
            line["reason"] = "no reference: the single run failed"
        else:
            difference = max_param_diff(read_weights(Path(first["run_dir"]) / "weights.safetensors"), reference)
            line |= {"max_param_diff": difference, "equivalent": difference <= limit}
            if difference > limit:
                line["reason"] = explain(first["model"], first["world_size"], difference, limit,
                                         first.get("device", "cpu"))
        lines.append(line)
    return {"rows": lines, "runs": runs}


def table(summary: dict) -> str:
    out = ["| row | procs | samples/s | speedup | peak RSS MB/rank | max Δparam (tol) | equivalent |",
           "|---|---:|---:|---:|---|---|---|"]
    for line in summary["rows"]:
        if line["status"] != "ok":
            out.append(f"| {line['row']} | {line['processes']} | | | | | {line['status']} |")
            continue
        diff = "—" if line["max_param_diff"] is None else f"{line['max_param_diff']:.1e} ({line['tolerance']:.0e})"
        verdict = "—" if line["equivalent"] is None else ("pass" if line["equivalent"] else "FAIL")
        speedup = f"{line['speedup']:.2f}×" if line["speedup"] else "—"
        out.append(f"| {line['row']} | {line['processes']} | {line['samples_per_s'] or 0:,.0f} | {speedup} | "
                   f"{', '.join(f'{p:.0f}' for p in line['peak_rss_mb'])} | {diff} | {verdict} |")
    reasons = [f"- {line['row']}: {line['reason']}" for line in summary["rows"] if line.get("reason")]
    return "\n".join(out + ([""] + reasons if reasons else []))


def write(summary: dict, meta: dict, out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {"md": out / "report.md", "json": out / "report.json", "png": out / "report.png"}
    write_text_atomic(paths["md"], f"# rankwise bench --script {meta['script']}\n\n{table(summary)}\n")
    write_text_atomic(paths["json"], json.dumps({**summary, "meta": meta}, indent=2, default=str))
    measured = [line for line in summary["rows"] if line["status"] == "ok"]
    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.bar([line["row"] for line in measured], [line["samples_per_s"] or 0 for line in measured],
             color=["tab:green" if line["equivalent"] is not False else "tab:red" for line in measured])
    axis.set_ylabel("samples/s (steady)")
    axis.set_title(f"{Path(meta['script']).name}: red = not equivalent to single")
    figure.tight_layout()
    figure.savefig(paths["png"], dpi=120)
    plt.close(figure)
    return paths


def bench(args) -> int:
    """``rankwise bench --script``: run, write report.md/json/png, print the table."""
    from rankwise.tools.machine import machine

    script = Path(args.script)
    if not script.is_file():
        raise ConfigError(f"--script {script}: no such file")
    if args.steps < 2:
        raise ConfigError("--steps must be at least 2 (a warm-up step and a measured one)")
    strategies = [n.strip() for n in args.strategies.split(",") if n.strip()] if args.strategies else \
        list(DEFAULT_STRATEGIES)
    rows = rows_for(strategies, args.nproc)
    out = Path(args.out or f"runs/bench-{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    print(f"rankwise bench --script {script}: {len(rows)} rows x {args.repeats or 1} repeat(s), {args.steps} steps, "
          f"{args.nproc} processes; writing to {out}", file=sys.stderr, flush=True)
    summary = run_bench(script, script_args, rows, steps=args.steps, repeats=args.repeats or 1,
                        precision=args.precision, out=out)
    meta = {"script": str(script), "script_args": script_args, "steps": args.steps, "nproc": args.nproc,
            **machine()}
    paths = write(summary, meta, out)
    print(table(summary))
    print(f"\nwrote {paths['md']}, {paths['json']}, {paths['png']}")
    if args.json:
        print(json.dumps({"rows": summary["rows"]}, default=str))
    failed = [line["row"] for line in summary["rows"]
              if line["status"].startswith("failed") or line.get("equivalent") is False]
    if failed:
        print(f"rankwise bench: {', '.join(failed)} failed a run or the equivalence check (see the table)",
              file=sys.stderr)
    return 1 if failed else 0
