"""`rankwise bench --script` on a script by world size, as the tests of each framework's rows run
it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def script_rows(script: Path, out: Path, steps: int = 8) -> dict[str, dict]:
    """Rows x1 and x2 of ``script`` (a short window, verify's lockstep over 2 steps), by row
    name."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "bench",
            "--script",
            str(script),
            "--nproc-per-node",
            "1,2",
            "--steps",
            str(steps),
            "--verify-steps",
            "2",
            "--min-window",
            "0",
            "--out",
            str(out / "bench"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {line["row"]: line for line in json.loads(proc.stdout.strip().splitlines()[-1])["rows"]}
