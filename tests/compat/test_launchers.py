"""The frameworks' launchers, run for real: what a script they start sees in its environment is
what ``rankwise.compat.launchers`` records (a release that changes it fails here, not in a user's
run)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankwise.compat.launchers import ACCELERATE_LAUNCH_CPU, accelerate_launch_cpu, fabric_run

pytestmark = pytest.mark.multiproc

DUMP = """
import json, os
ours = {k: v for k, v in os.environ.items() if k.startswith(("LT_", "ACCELERATE_"))}
if os.environ.get("RANK", "0") == "0":
    print("ENV " + json.dumps(ours))
"""


def _seen(tmp_path: Path, *command: str) -> dict[str, str]:
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    # (the launcher's own defaults: no variable of theirs from this environment, no config file)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LT_", "ACCELERATE_", "RANK"))}
    env |= {"HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*command, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("ENV ")]
    return json.loads(line[4:])


def test_fabric_run_hands_the_script_what_the_record_says(tmp_path):
    fabric = Path(sys.executable).parent / "fabric"
    seen = _seen(tmp_path, str(fabric), "run", "--accelerator", "cpu", "--devices", "2")
    assert seen == fabric_run(2, "cpu")


def test_accelerate_launch_cpu_hands_the_script_what_the_record_says(tmp_path):
    accelerate = Path(sys.executable).parent / "accelerate"
    seen = _seen(tmp_path, str(accelerate), "launch", "--cpu", "--num_processes", "1")
    recorded = accelerate_launch_cpu()
    # (it sets its compile options too, each "off": only what the record names is relied on)
    assert {key: seen.get(key) for key in recorded} == recorded
    assert set(ACCELERATE_LAUNCH_CPU.environment) <= set(seen)
