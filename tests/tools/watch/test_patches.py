"""Everything the watcher replaces in torch and the frameworks is recorded in
``rankwise.compat.watch_patches``, and every record is something it replaces: the watcher and each
framework's adapter installed in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankwise.compat.watch_patches import PATCHES

pytestmark = pytest.mark.multiproc  # (torch patched for good: in a process of its own)

ROOT = Path(__file__).parents[3]
INSTALL_EVERYTHING = """
import json, sys, tempfile, warnings
warnings.simplefilter("ignore")
from rankwise.compat.versions import Patch
made = []
check = Patch.check
Patch.check = lambda record: (made.append(record.target), check(record))[1]
import accelerate.accelerator  # (the watcher patches Accelerate once the script imported it)
import lightning.pytorch, pytorch_lightning, torchmetrics  # (their metrics, likewise)
import horovod.torch  # (and its collectives)
import lightning.fabric, lightning_fabric  # (Fabric's print)
from rankwise.tools.watch import deepspeed_engine, horovod_optimizer, lightning, spawned
from rankwise.tools.watch.settings import WatchSettings
from rankwise.tools.watch.watcher import Watcher
settings = WatchSettings(tempfile.mkdtemp(), watched_steps=3, spawn=spawned.ONE)
watcher = Watcher(settings)
watcher.install()
watcher.calls.patch_frameworks()
deepspeed_engine.watch(watcher)
horovod_optimizer.watch(watcher)
lightning.launcher_devices()
spawned.InitSeen(0, one_process=True).install(lambda: None)
spawned.install_spawn_patch(settings)
print(json.dumps(made))
"""


def test_every_replacement_the_watcher_makes_is_recorded_and_every_record_is_one():
    for module in (
        "deepspeed",
        "horovod.torch",
        "lightning",
        "pytorch_lightning",
        "accelerate",
        "torchmetrics",
    ):
        pytest.importorskip(module)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
        ),
    }
    proc = subprocess.run(
        [sys.executable, "-c", INSTALL_EVERYTHING],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # (an unrecorded replacement: LookupError)
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(made) == len(set(made))  # each replaced once
    assert sorted(made) == sorted(PATCHES)
