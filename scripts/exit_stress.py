"""How stock two-rank scripts end, counted over many launches: cleanly, named and ended by the exit
guard, failed, or hung silently.

    .venv/bin/python scripts/exit_stress.py --runs 50                     # under `rankwise launch`
    (the guard) .venv/bin/python scripts/exit_stress.py --runs 50 --launcher torchrun # torch's own
    launcher: no guard

The scripts: Accelerate's quick tour as users write it (``tests/support/launch/quick_tour_exit.py``:
main(), gather_for_metrics, rank 0 saves, end_training) and a DDP script in the style of PyTorch's
tutorial series (``tests/support/tools/watch/scripts/tutorial_ddp.py``), and the deadlock's own
pattern (``tests/support/launch/gloo_exit_deadlock.py``: a collective still in gloo's worker when
the DDP model frees the destroyed group).  A launch still running ``--hang-after`` seconds after it
started is a silent hang: it is stopped with every process it started and counted so.  The exit
guard's ``--exit-grace`` must stay below it.  Prints a table and writes ``OUT/exit-stress.json``
(each run's outcome and wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from rankwise.launch.exits import HUNG_AT_EXIT
from rankwise.tools.stopping import stop_tree

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {
    "accelerate quick tour": (ROOT / "tests/support/launch/quick_tour_exit.py", ["{tmp}"]),
    "DDP tutorial style": (
        ROOT / "tests/support/tools/watch/scripts/tutorial_ddp.py",
        ["--total-epochs", "2"],
    ),
    "gloo exit deadlock": (ROOT / "tests/support/launch/gloo_exit_deadlock.py", []),
}
OUTCOMES = ("clean", "named and ended", "failed", "silent hang")


def launch_command(launcher: str, grace: float, script: Path, args: list[str]) -> list[str]:
    if launcher == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            str(script),
            *args,
        ]
    return [
        sys.executable,
        "-m",
        "rankwise.cli",
        "launch",
        "--nproc-per-node",
        "2",
        "--exit-grace",
        f"{grace:g}",
        str(script),
        *args,
    ]


def one_run(command: list[str], hang_after: float, cwd: Path) -> dict:
    """Launch once; how it ended, its wall time and (unless clean) the end of what it printed."""
    started = time.monotonic()
    env = {**os.environ, "ACCELERATE_USE_CPU": "true"}
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=hang_after)
            outcome = {0: "clean", HUNG_AT_EXIT: "named and ended"}.get(proc.returncode, "failed")
        except subprocess.TimeoutExpired:
            stop_tree(proc, grace_s=5)
            outcome = "silent hang"
        output.seek(0)
        printed = output.read()
    result = {
        "outcome": outcome,
        "wall_s": round(time.monotonic() - started, 2),
        "exit": proc.returncode,
    }
    if outcome != "clean":
        result["printed"] = printed[-1500:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=50, help="launches of each script (default %(default)s)"
    )
    parser.add_argument("--launcher", choices=["rankwise", "torchrun"], default="rankwise")
    parser.add_argument(
        "--exit-grace", type=float, default=30.0, help="rankwise launch --exit-grace (default 30)"
    )
    parser.add_argument(
        "--hang-after",
        type=float,
        default=120.0,
        help="seconds after which a launch still running is a silent hang (default %(default)s)",
    )
    parser.add_argument(
        "--scripts", default=",".join(SCRIPTS), help="which (comma-separated; default all)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "exit-stress")
    args = parser.parse_args(argv)
    if args.launcher == "rankwise" and args.exit_grace >= args.hang_after:
        parser.error(
            "--exit-grace must be shorter than --hang-after, or every guarded hang reads as silent"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {}
    for name in args.scripts.split(","):
        script, script_args = SCRIPTS[name]
        results[name] = []
        with tempfile.TemporaryDirectory(prefix="rankwise-exit-stress-") as tmp:
            command = launch_command(
                args.launcher, args.exit_grace, script, [a.format(tmp=tmp) for a in script_args]
            )
            for attempt in range(args.runs):
                result = one_run(command, args.hang_after, Path(tmp))
                results[name].append(result)
                print(
                    f"{name} {attempt + 1}/{args.runs}: {result['outcome']} in "
                    f"{result['wall_s']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    (args.out / "exit-stress.json").write_text(
        json.dumps(
            {
                "launcher": args.launcher,
                "exit_grace": args.exit_grace,
                "hang_after": args.hang_after,
                "runs": results,
            },
            indent=1,
        )
    )
    print(
        f"\n{args.runs} launches of each script, 2 ranks, {args.launcher} launch"
        + (f" --exit-grace {args.exit_grace:g}" if args.launcher == "rankwise" else "")
        + ":"
    )
    print(
        f"  {'script':<24}"
        + "".join(f"{outcome:>17}" for outcome in OUTCOMES)
        + f"{'wall s (median)':>17}"
    )
    for name, runs in results.items():
        counts = Counter(run["outcome"] for run in runs)
        walls = sorted(run["wall_s"] for run in runs)
        print(
            f"  {name:<24}"
            + "".join(f"{counts[outcome]:>17}" for outcome in OUTCOMES)
            + f"{walls[len(walls) // 2]:>17.1f}"
        )
    silent = sum(run["outcome"] == "silent hang" for runs in results.values() for run in runs)
    return 1 if silent else 0


if __name__ == "__main__":
    sys.exit(main())
