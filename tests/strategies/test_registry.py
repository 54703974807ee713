import subprocess
import sys

import pytest

from rankwise.errors import ConfigError
from rankwise.strategies import lookup


@pytest.mark.multiproc
def test_every_strategy_is_found_after_one_module_was_imported_directly():
    # A fresh interpreter: the registry is process-global, and other tests have filled it already.
    code = ("import rankwise.strategies.deepspeed\n"
            "from rankwise.strategies import strategy_names\n"
            "print(' '.join(strategy_names()))")
    names = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           timeout=120).stdout.split()
    assert names == ["accelerate", "ddp", "ddp-spawn", "deepspeed", "deepspeed-zero0", "deepspeed-zero1",
                     "deepspeed-zero2", "deepspeed-zero3", "dp", "fsdp", "horovod", "single"]


def test_a_variant_fixes_its_settings_in_the_config_and_the_runtime_options():
    from rankwise.strategies import resolve_options
    from rankwise.train.config import build_config

    cfg = build_config(overrides=["strategy=deepspeed-zero3", "deepspeed.bucket_size=1000"])
    assert (cfg.deepspeed.zero_stage, cfg.deepspeed.bucket_size) == (3, 1000)
    assert build_config(overrides=["strategy=ddp-spawn"]).launch.launcher == "spawn"
    options = resolve_options(lookup("deepspeed-zero1"), {"bucket_size": 7})
    assert (options.zero_stage, options.bucket_size) == (1, 7)
    with pytest.raises(ConfigError, match="'deepspeed-zero3' sets deepspeed.zero_stage=3; it was also given 2"):
        build_config(overrides=["strategy=deepspeed-zero3", "deepspeed.zero_stage=2"])
    with pytest.raises(ConfigError, match="sets deepspeed.zero_stage=1; it was also given 2"):
        resolve_options(lookup("deepspeed-zero1"), {"zero_stage": 2})
    with pytest.raises(ConfigError, match="strategy 'single' takes no options"):
        resolve_options(lookup("single"), {"zero_stage": 2})


def test_an_unknown_option_names_the_one_it_resembles_or_lists_them_all():
    from rankwise.strategies import resolve_options

    with pytest.raises(ConfigError, match=r"ddp.bucket_cap: no such option .*; did you mean ddp.bucket_cap_mb\?"):
        resolve_options(lookup("ddp"), {"bucket_cap": 1})
    with pytest.raises(ConfigError, match="deepspeed takes zero_stage, "):
        resolve_options(lookup("deepspeed"), {"zzz": 1})
