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

from rankwise.errors import LaunchError
from rankwise.launch.config import LaunchConfig
from rankwise.launch.entry import Entry
from rankwise.launch.ports import free_port, set_worker_environment


def horovodrun_command(nproc: int, entry: list[str]) -> list[str]:
    binary = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))
    if not Path(binary).exists():
        raise LaunchError(
            ["horovodrun not found: pip install 'rankwise[horovod]' (see scripts/build_horovod.sh)"]
        )
    return [binary, "-np", str(nproc), "-H", f"localhost:{nproc}", "--gloo", sys.executable, *entry]


def launch(config: LaunchConfig, entry: Entry) -> None:
    """Run ``entry`` on ``config.nproc_per_node`` local workers under ``horovodrun --gloo`` (one
    node)."""
    if config.multi_node:
        raise LaunchError(
            [
                "the horovodrun launcher starts one node; for several run `horovodrun -np N -H "
                "host1:n,host2:n --gloo python -m rankwise.train.worker RUN_DIR`"
            ]
        )
    nproc = config.nproc_per_node
    set_worker_environment(nproc)
    env = dict(
        os.environ,
        MASTER_ADDR=config.master_addr,
        MASTER_PORT=str(config.master_port or free_port()),
    )
    proc = subprocess.run(horovodrun_command(nproc, entry.argv()), env=env)
    if proc.returncode:
        raise LaunchError(
            [
                f"horovodrun exited with code {proc.returncode}; each rank's output above is "
                "prefixed with [rank]"
            ]
        )
