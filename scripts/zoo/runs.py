"""Running one case's commands: the patched copy, the CLI as a user types it, the plain run.

Each command runs in its own fresh copy of the patched case (a script that writes a snapshot next
to itself must not resume from the previous command's), from that copy's directory as the
script's own docs start it, with the CLI by its path in the virtual environment.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cases import Case

PLAIN = {
    "torch": ["torchrun", "--standalone", "--nproc-per-node", "2", "{script}", "{args}"],
    "trainer": ["torchrun", "--standalone", "--nproc-per-node", "2", "{script}", "{args}"],
    "deepspeed": ["torchrun", "--standalone", "--nproc-per-node", "2", "{script}", "{args}"],
    "spawn": ["{python}", "{script}", "{args}"],
    "lightning": ["{python}", "{script}", "{args}"],
    "accelerate": ["accelerate", "launch", "--cpu", "--num_processes", "2", "{script}", "{args}"],
    "fabric": ["fabric", "run", "--accelerator", "cpu", "--devices", "2", "{script}", "{args}"],
    "horovod": ["horovodrun", "-np", "2", "--gloo", "{python}", "{script}", "{args}"],
}
"""The plain run of each framework at 2 processes, as its own launcher starts it ([run] plain
overrides: a list with {python}, {script} and {args})."""

COMMANDS = ("verify", "bench", "plan", "plain")


@dataclass
class Command:
    name: str
    argv: list[str]
    out: Path | None  # the report directory rankwise writes (None: the plain run)
    timeout: int


def tool(name: str) -> str:
    """An executable of the virtual environment the runner runs in, else from PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def commands(case: Case, rankwise: str, out: Path) -> list[Command]:
    script, args, steps = case.script, list(case.run["args"]), str(case.run["steps"])
    timeout = int(case.run.get("timeout", 900))
    plain = [
        part
        for template in case.run.get("plain", PLAIN[case.run["framework"]])
        for part in (args if template == "{args}" else [template])
    ]
    plain = [p.format(python=sys.executable, script=script) for p in plain]
    plain[0] = tool(plain[0]) if "/" not in plain[0] else plain[0]
    bench_steps = str(case.run.get("bench_steps", 5))
    return [
        Command(
            "verify",
            [rankwise, "verify", script, "--nproc-per-node", "2", "--steps", steps]
            + ["--out", str(out / "verify"), "--", *args],
            out / "verify",
            timeout,
        ),
        Command(
            "bench",
            [
                rankwise,
                "bench",
                "--script",
                script,
                "--nproc-per-node",
                "1,2",
                "--steps",
                bench_steps,
            ]
            + ["--min-window", "0", "--verify-steps", steps, "--no-progress"]
            + ["--out", str(out / "bench"), "--", *args],
            out / "bench",
            timeout,
        ),
        Command(
            "plan",
            [rankwise, "plan", script, "--out", str(out / "plan"), "--", *args],
            out / "plan",
            timeout,
        ),
        Command("plain", plain, None, timeout),
    ]


def site_for(case: Case, base: Path) -> Path | None:
    """The case's [run] requires, pip-installed (no dependencies, pinned) into a directory of their
    own under ``base`` once, for PYTHONPATH: the project's environment is left as it is.  ``base``
    is under the environment's ``sys.prefix``: dill (under datasets) pickles a module outside it by
    value, and fails on pyarrow's."""
    requires = sorted(case.run.get("requires", []))
    if not requires:
        return None
    site = base / hashlib.sha1(" ".join(requires).encode()).hexdigest()[:12]
    if not (site / ".done").exists():
        shutil.rmtree(site, ignore_errors=True)
        pip = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            *requires,
        ]
        subprocess.run(
            pip, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        (site / ".done").touch()
    return site


def environment(site: Path | None) -> dict[str, str]:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env


def workdir(case: Case, where: Path) -> Path:
    """A fresh copy of the case as the zoo runs it: the originals with cpu.patch applied."""
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    for name, text in case.patched().items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    for extra in case.run.get("data", []):  # files the patched script reads, kept beside the case
        shutil.copy(case.dir / extra, where / Path(extra).name)
    return where


def run(command: Command, cwd: Path, env: dict[str, str], log: Path) -> tuple[int, float]:
    """Exit code (124: timed out) and wall seconds; stdout and stderr to ``log``."""
    if command.out is not None:
        shutil.rmtree(command.out, ignore_errors=True)
    started = time.monotonic()
    with log.open("w") as sink:
        sink.write("$ " + " ".join(command.argv) + "\n")
        sink.flush()
        process = subprocess.Popen(
            command.argv,
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=command.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)  # its own session: the launcher and every rank it started
            process.wait()
            code = 124
    return code, time.monotonic() - started
