"""The ``rankwise`` command in a fresh process, as a user runs it, from a test: the repository's
root, the environment a command gets, the small training job most command tests run, and the
``--json`` summary it prints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).parents[2]
"""The repository: the examples, docs and scripts the tests run, and the directory commands start
in."""

RANK_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_PORT")
"""What a launcher sets for a rank: a command started from a test run inside one must not take
itself for it."""
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""The network interface: a command on another host (a network namespace) chooses its own."""
LAUNCH_VARIABLES = (*RANK_VARIABLES, "MASTER_ADDR", "LOCAL_RANK", *INTERFACE_VARIABLES)
"""Everything a launcher or an interface choice sets: a multi-node job's agents must find their
own."""


def command_env(
    drop: Iterable[str] = RANK_VARIABLES, *, src: bool = False, **extra: str
) -> dict[str, str]:
    """This process's environment for a command a test starts: without ``drop``; with the checkout's
    ``src/`` first on ``PYTHONPATH`` where ``src`` (a process that imports rankwise without the
    test's ``sys.path``: mkdocs, a script); then ``extra``."""
    dropped = set(drop)
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    if src:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])
        )
    env.update(extra)
    return env


def command(*args: str) -> list[str]:
    """The command line of ``rankwise ARGS`` with this interpreter."""
    return [sys.executable, "-m", "rankwise.cli", *args]


def rankwise(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    cwd: Path | str | None = ROOT,
) -> subprocess.CompletedProcess:
    """``rankwise ARGS`` in a fresh process, its output captured as text; the environment
    :func:`command_env`'s unless given."""
    return subprocess.run(
        command(*args),
        env=command_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def json_summary(proc: subprocess.CompletedProcess) -> dict:
    """A ``--json`` command's summary: the last line of its output."""
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tiny_text(limit: int = 300, max_length: int = 32, eval_batch_size: int = 64) -> tuple[str, ...]:
    """``rankwise train`` flags for the small text job: the built-in sentiment data cut to ``limit``
    samples, a character tokenizer, short sequences, large evaluation batches."""
    return (
        "--data",
        "sentiment",
        "--set",
        f"data.limit={limit}",
        "--set",
        f"data.max_length={max_length}",
        "--set",
        "data.tokenizer=char",
        "--set",
        f"eval_batch_size={eval_batch_size}",
    )


def sigterm_in_first_step(
    proc: subprocess.Popen, out: Path, *, after_s: float = 3.0, start_s: float = 120.0
) -> tuple[str, float]:
    """SIGTERM a ``rankwise train --out OUT`` process ``after_s`` seconds into its first step (its
    ``metrics.jsonl`` is written as the loop starts it); returns its stderr and the seconds from the
    signal to its end."""
    deadline = time.monotonic() + start_s
    while not (out / "metrics.jsonl").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(after_s)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=90)
    return stderr, time.monotonic() - started
