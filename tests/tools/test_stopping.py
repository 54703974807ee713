"""Stopping rankwise stops everything it started: a SIGTERM to `rankwise verify` or `rankwise
launch` mid-run ends their launcher and ranks (torchrun starts each rank in a session of its own,
out of reach of a process group's signal), and says so."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

STALLS = Path(__file__).parents[1] / "support" / "tools" / "watch" / "scripts" / "stalls.py"


@pytest.mark.parametrize("command", ["verify", "launch", "comm"])
def test_a_sigterm_mid_run_leaves_no_process_of_the_run_alive(command, tmp_path):
    args = {
        "verify": ["verify", str(STALLS), "--out", str(tmp_path / "run")],
        "launch": ["launch", "--nproc-per-node", "2", str(STALLS)],
        "comm": ["comm", "bench", "--iters", "1000"],
    }[command]  # (the spawn launcher's ranks)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankwise.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        family: list[psutil.Process] = []
        deadline = time.monotonic() + 90
        while sum(_is_rank(p) for p in family) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][
                -3000:
            ]
            time.sleep(0.5)
            family = psutil.Process(proc.pid).children(recursive=True)
        # (the ranks are in their loop: rank 0 sleeps at its third step, rank 1 waits for it)
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        time.sleep(10)
        alive = [
            p.cmdline() for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()
    assert alive == [], f"still running 10 s after rankwise {command} was stopped: {alive}"
    assert proc.returncode == 128 + signal.SIGTERM, proc.returncode
    assert (
        f"rankwise {' '.join(args[:2] if command == 'comm' else args[:1])}: stopped by SIGTERM"
        in stderr
    ), stderr
    if command == "verify":
        assert (
            "ended the run it had started, its launcher and the 2 processes under it" in stderr
        ), stderr[-3000:]


def _is_rank(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        line = " ".join(process.cmdline())
        return any(
            rank in line
            for rank in ("rankwise.launch.script", "rankwise.tools.watch.bootstrap", "spawn_main")
        )
    return False
