"""`rankwise launch script.py`: the script runs as `python script.py` would, and its ranks exit
cleanly even when it leaves its DDP model alive and its process group open (rankwise.launch.script
closes it as rankwise's loop does)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

SCRIPT = Path(__file__).parents[1] / "support" / "launch" / "open_group_script.py"


def test_a_script_runs_as_main_with_its_own_argv_and_directory(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rankwise.cli",
            "launch",
            "--nproc-per-node",
            "2",
            str(SCRIPT),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["name"] == "__main__" and seen["argv"] == [str(SCRIPT), str(tmp_path)]
        assert seen["path0"] == str(SCRIPT.parent) and seen["file"] == str(SCRIPT)


def test_ten_launches_of_a_script_that_leaves_its_group_open_all_exit_cleanly_within_seconds(
    tmp_path,
):
    took = []
    for attempt in range(10):
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "rankwise.cli",
                "launch",
                "--nproc-per-node",
                "2",
                str(SCRIPT),
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        took.append(time.perf_counter() - started)
        assert proc.returncode == 0, (
            f"launch {attempt}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        )
        assert "terminate called" not in proc.stderr and "SIGABRT" not in proc.stderr, proc.stderr[
            -3000:
        ]
    print(f"10 launches: {min(took):.1f} .. {max(took):.1f} s each")
