"""A stop signal that the loop cannot act on at a step boundary in time (a compile, an evaluation, a
checkpoint write) still ends the process within the grace."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import command, command_env, sigterm_in_first_step

NEVER_REACHES_A_BOUNDARY = """
import time
from rankwise.train.preemption import StopRequest

stop = StopRequest(grace_s=2.0)
print("ready", flush=True)
while True:  # a step that does not end (the first step of a compiled model, compiling)
    sum(range(10_000))
"""


@pytest.mark.multiproc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_the_process_within_the_grace_without_a_step_boundary(sig):
    proc = subprocess.Popen(
        [sys.executable, "-c", NEVER_REACHES_A_BOUNDARY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=command_env((), src=True),
    )
    assert proc.stdout.readline().strip() == "ready"
    started = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(timeout=30)
    waited = time.monotonic() - started
    assert code == 128 + sig, proc.stderr.read()
    # (the grace, 2 s here, and the interpreter's exit; GRACE_S is 20 in a run)
    assert 2.0 <= waited < 15, waited
    said = proc.stderr.read()
    assert f"stopped by {sig.name} 2 s ago and no step boundary reached since" in said
    assert "the last finished checkpoint is kept" in said


@pytest.mark.multiproc
def test_sigterm_while_the_first_compiled_step_compiles_ends_the_run_within_30_s(tmp_path):
    """``rankwise train --set compile=true``: the first step of the tiny text model compiles for
    minutes on these CPUs (measured: 172 s of Dynamo compiles over 6 steps); a SIGTERM 3 s into it
    ends the run within the grace, exit 143, and no checkpoint is claimed (none was finished)."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        command(
            "train",
            "--data",
            "sentiment",
            "--model",
            "tiny",
            "--max-steps",
            "6",
            "--strategy",
            "single",
            "--no-progress",
            "--set",
            "compile=true",
            "--out",
            str(out),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # (a first compile: inductor's on-disk caches would make a later run's compile fast)
        env=command_env((), src=True, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1"),
    )
    stderr, waited = sigterm_in_first_step(proc, out)
    print(f"ended {waited:.1f} s after SIGTERM; it said:\n{stderr[-1500:]}")
    assert proc.returncode == 143, stderr[-3000:]
    assert waited < 30, waited
    assert "no step boundary reached since (a compile" in stderr, stderr[-3000:]
    assert not (out / "checkpoints" / "latest").exists()
