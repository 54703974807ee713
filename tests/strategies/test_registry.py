"""Strategies are discovered by name, whatever was imported first."""

import subprocess
import sys


def test_every_strategy_is_found_after_one_module_was_imported_directly():
    # A fresh interpreter: the registry is process-global, and other tests have filled it already.
    code = ("import rankwise.strategies.deepspeed\n"
            "from rankwise.strategies import strategy_names\n"
            "print(' '.join(strategy_names()))")
    names = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           timeout=120).stdout.split()
    assert names == ["accelerate", "ddp", "deepspeed", "dp", "fsdp", "horovod", "single"]
