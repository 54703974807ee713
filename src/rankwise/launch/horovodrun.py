"""The horovodrun launcher: ``horovodrun -np N -H localhost:N --gloo python -m ...``.

Horovod's gloo controller needs the rendezvous horovodrun provides.  rankwise also
exports MASTER_ADDR / MASTER_PORT so its own torch collectives can form a group beside
Horovod's.  One node only; for several hosts run horovodrun yourself with ``-H``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from rankwise.launch.errors import LaunchError
from rankwise.launch.ports import free_port, set_worker_environment


def horovodrun_command(nproc: int, entry: list[str]) -> list[str]:
    binary = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))
    if not Path(binary).exists():
        raise LaunchError(["horovodrun not found: pip install 'rankwise[horovod]' (see scripts/build_horovod.sh)"])
    return [binary, "-np", str(nproc), "-H", f"localhost:{nproc}", "--gloo", sys.executable, *entry]


def launch(nproc: int, entry: list[str], *, nnodes: int = 1, master_addr: str = "127.0.0.1",
           master_port: int | None = None) -> None:
    if nnodes != 1:
        raise LaunchError(["the horovodrun launcher starts one node; for several run "
                           "`horovodrun -np N -H host1:n,host2:n --gloo python -m rankwise.launch.worker RUN_DIR`"])
    set_worker_environment(nproc)
    env = dict(os.environ, MASTER_ADDR=master_addr, MASTER_PORT=str(master_port or free_port()))
    proc = subprocess.run(horovodrun_command(nproc, entry), env=env)
    if proc.returncode:
        raise LaunchError([f"horovodrun exited with code {proc.returncode}; each rank's output above is "
                           "prefixed with [rank]"])
