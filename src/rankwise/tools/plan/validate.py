"""``rankwise plan --validate``: the plan against real runs, at the world sizes this machine can
run.

Every planned strategy that ``rankwise launch`` starts (not Horovod: ``horovodrun``) runs the script
for real at each planned world size up to this machine's cores, one node, each rank measured by
:mod:`~rankwise.tools.plan.probe` (peak tensor memory from torch's profiler memory events, steady
step time).  The plan for the same world sizes is made first, so both see the same script, precision
and micro-batch.  The error is (planned - measured) / measured; a row passes within
:data:`MEMORY_BOUND` for memory (the largest rank's peak) and :data:`TIME_BOUND` for the step time
(the slowest rank's median).

Every rank runs one thread (``OMP_NUM_THREADS=1``, in the plan's own timing too): with two threads
on a 2-core machine that runs anything else, the same one-process step took 24 ms in one run and 506
ms in the next (OpenMP's threads wait for a core another process holds), which no plan can predict.
Unless ``--comm`` gives one, the bandwidth model is calibrated first by a short ``rankwise comm
bench`` at the largest world size validated (all_reduce, all_gather and reduce_scatter, 4 B to 8
MiB) and by what one call costs there between two computations
(:mod:`~rankwise.tools.plan.between`): what a collective costs on this machine as it is now.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rankwise.checkpoint import write_text_atomic
from rankwise.process import usable_cores
from rankwise.strategies import lookup
from rankwise.tools.harness import run_measured
from rankwise.tools.plan import report
from rankwise.tools.plan.between import FILE as BETWEEN
from rankwise.tools.plan.command import capture_script, make_plan
from rankwise.tools.plan.config import PlanConfig
from rankwise.tools.plan.planner import Row
from rankwise.tools.plan.probe import PROBE, ProbeRecord

MEMORY_BOUND = 0.10
"""The stated bound on the planned peak memory's error."""
TIME_BOUND = 0.25
"""The stated bound on the planned step time's error."""


@dataclass
class Checked:
    """One strategy at one world size, planned against measured."""

    strategy: str
    """The strategy's registered name."""
    world_size: int
    """Ranks of the real run."""
    planned_bytes: int
    """The plan's peak memory of one rank."""
    measured_bytes: int | None
    """The largest rank's measured peak tensor memory (``None``: the run gave none)."""
    planned_s: float
    """The plan's step time."""
    measured_s: float | None
    """The slowest rank's measured median step time."""
    error: str = ""
    """Why the real run gave no measurement (empty when it did)."""

    @property
    def memory_error(self) -> float | None:
        return (
            None
            if not self.measured_bytes
            else (self.planned_bytes - self.measured_bytes) / self.measured_bytes
        )

    @property
    def time_error(self) -> float | None:
        return None if not self.measured_s else (self.planned_s - self.measured_s) / self.measured_s

    @property
    def passed(self) -> bool:
        return (
            self.memory_error is not None
            and abs(self.memory_error) <= MEMORY_BOUND
            and self.time_error is not None
            and abs(self.time_error) <= TIME_BOUND
        )


def measure(
    config: PlanConfig, strategy: str, world: int, out: Path, timeout_s: float = 900.0
) -> dict:
    """One real run of the script at ``world`` ranks under ``strategy``: every rank's probe record,
    or an error."""
    directory = out / f"{strategy}-{world}"
    for stale in directory.glob("probe-rank*.json"):
        stale.unlink()
    command = [
        sys.executable,
        "-m",
        "rankwise.cli",
        "launch",
        "--nproc-per-node",
        str(world),
        "--strategy",
        strategy,
        "--precision",
        config.precision,
        "-m",
        "rankwise.tools.plan.probe",
        str(config.script.resolve()),
        *config.script_args,
    ]
    result = run_measured(
        command,
        directory,
        env={PROBE: str(directory.resolve())},
        timeout_s=timeout_s,
        cwd=directory,
        result_file=directory / "probe-rank0.json",
    )
    records: list[ProbeRecord] = [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(directory.glob("probe-rank*.json"))
    ]
    if len(records) != world:
        return {
            "error": result.get("error")
            or f"{len(records)} of {world} ranks measured; see {directory}"
        }
    return {
        "peak_bytes": max(r["peak_bytes"] for r in records),
        "step_s": max(r["step_s"] for r in records),
        "ranks": records,
    }


def comm_bench(world: int, out: Path) -> Path:
    """A short ``rankwise comm bench`` at ``world`` ranks, and each call's cost between computations
    beside it (:mod:`~rankwise.tools.plan.between`); its ``comm.json``."""
    command = [
        sys.executable,
        "-m",
        "rankwise.cli",
        "comm",
        "bench",
        "--nproc-per-node",
        str(world),
        "--ops",
        "all_reduce,all_gather,reduce_scatter",
        "--max-bytes",
        "8M",
        "--iters",
        "10",
        "--warmup",
        "3",
        "--no-ceilings",
        "--no-progress",
        "--out",
        str(out),
    ]
    print(
        f"calibrating the bandwidth model: rankwise comm bench at {world} ranks ...",
        file=sys.stderr,
        flush=True,
    )
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode or not (out / "comm.json").is_file():
        from rankwise.errors import ConfigError

        raise ConfigError(
            f"rankwise comm bench failed (exit {result.returncode}): {result.stderr[-2000:]}"
        )
    if world > 1:
        between = [
            sys.executable,
            "-m",
            "rankwise.cli",
            "launch",
            "--nproc-per-node",
            str(world),
            "-m",
            "rankwise.tools.plan.between",
            str(out / BETWEEN),
        ]
        result = subprocess.run(between, capture_output=True, text=True)
        if result.returncode or not (out / BETWEEN).is_file():
            from rankwise.errors import ConfigError

            raise ConfigError(
                f"measuring a call between computations failed (exit {result.returncode}): "
                f"{result.stderr[-2000:]}"
            )
    return out / "comm.json"


def check(row: Row, measured: dict) -> Checked:
    return Checked(
        row.strategy,
        row.world_size,
        row.memory.peak,
        measured.get("peak_bytes"),
        row.time.total_s,
        measured.get("step_s"),
        measured.get("error", ""),
    )


def table(checked: list[Checked]) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:+.1%}"

    head = (
        "strategy",
        "ranks",
        "memory planned",
        "measured",
        "error",
        "step planned",
        "measured",
        "error",
        "",
    )
    lines = [head]
    for c in checked:
        lines.append(
            (
                c.strategy,
                str(c.world_size),
                report.size(c.planned_bytes),
                report.size(c.measured_bytes) if c.measured_bytes else "-",
                pct(c.memory_error),
                report.ms(c.planned_s),
                report.ms(c.measured_s) if c.measured_s else "-",
                pct(c.time_error),
                "ok" if c.passed else (c.error.splitlines()[0][:60] if c.error else "OUTSIDE"),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = [
        "  ".join(
            cell.rjust(w) if 0 < i < len(head) - 1 else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths))
        )
        for line in lines
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text) + (
        f"\n\nbounds: memory within {MEMORY_BOUND:.0%} of measured (the largest rank's peak tensor "
        f"memory), step time within {TIME_BOUND:.0%} (the slowest rank's median)"
    )


def run(config: PlanConfig, *, as_json: bool = False) -> int:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    most = gpus or usable_cores()  # a rank a GPU, or a rank a core
    runnable = [n for n in config.nproc_per_node if n <= most]
    if config.nnodes != 1 or not runnable:
        from rankwise.errors import ConfigError

        raise ConfigError(
            f"--validate runs the planned world sizes this machine can: one node, at most {most} "
            f"ranks ({'its GPUs' if gpus else 'its cores'}; asked: --nnodes {config.nnodes}, "
            f"--nproc-per-node {','.join(map(str, config.nproc_per_node))})"
        )
    # (see the module's docstring; the launched ranks inherit it)
    os.environ["OMP_NUM_THREADS"] = "1"
    capture = capture_script(config)
    if not capture.on_rankwise:
        from rankwise.errors import ConfigError

        raise ConfigError(
            f"--validate measures each strategy running {config.script} under rankwise launch, "
            "which needs a script on rankwise.setup() (docs/getting-started/porting.md); this one "
            "starts its own distributed job: plan it without --validate, or measure it with "
            "rankwise bench --script"
        )
    out = config.out / "validate"
    if config.comm is None and max(runnable) > 1:
        config = replace(config, comm=comm_bench(max(runnable), out / "comm"))
    # (on a GPU machine the plan is for the GPU present: --device's default)
    config = replace(config, nproc_per_node=runnable, device=None if gpus else "cpu")
    plan = make_plan(config, capture)
    checked = []
    for row in plan.rows:
        if lookup(row.strategy).cls.launcher is not None:
            continue  # started by its own launcher (horovodrun), not rankwise launch
        print(
            f"measuring {row.strategy} at {row.world_size} rank(s) ...", file=sys.stderr, flush=True
        )
        checked.append(check(row, measure(config, row.strategy, row.world_size, out)))
    paths = report.write(plan, config.out)
    text = table(checked)
    write_text_atomic(
        config.out / "validate.md",
        f"# rankwise plan --validate: {plan.capture.source}\n\n```text\n{text}\n```\n",
    )
    write_text_atomic(
        config.out / "validate.json",
        json.dumps(
            [
                {
                    **asdict(c),
                    "memory_error": c.memory_error,
                    "time_error": c.time_error,
                    "passed": c.passed,
                }
                for c in checked
            ],
            indent=2,
        ),
    )
    print(report.table(plan))
    print()
    print(text)
    print(
        f"\nwrote {', '.join(str(p) for p in paths)}, {config.out / 'validate.md'}, "
        f"{config.out / 'validate.json'}"
    )
    if as_json:
        print(
            json.dumps(
                {
                    "out": str(config.out),
                    "passed": all(c.passed for c in checked),
                    "rows": [
                        {
                            "strategy": c.strategy,
                            "world_size": c.world_size,
                            "memory_error": c.memory_error,
                            "time_error": c.time_error,
                        }
                        for c in checked
                    ],
                }
            )
        )
    return 0 if all(c.passed for c in checked) else 1
