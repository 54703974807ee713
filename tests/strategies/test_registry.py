import json
import os
import shutil
import subprocess
import sys

import pytest

from rankwise.errors import ConfigError
from rankwise.strategies import lookup
from tests.support.cli import ROOT


@pytest.mark.multiproc
def test_every_strategy_is_found_after_one_module_was_imported_directly():
    # A fresh interpreter: the registry is process-global, and other tests have filled it already.
    code = (
        "import rankwise.strategies.deepspeed\nfrom rankwise.strategies import "
        "strategy_names\nprint(' '.join(strategy_names()))"
    )
    names = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert names == [
        "accelerate",
        "ddp",
        "ddp-spawn",
        "deepspeed",
        "deepspeed-zero0",
        "deepspeed-zero1",
        "deepspeed-zero2",
        "deepspeed-zero3",
        "dp",
        "fsdp",
        "horovod",
        "single",
    ]


def test_a_variant_fixes_its_settings_in_the_config_and_the_runtime_options():
    from rankwise.strategies import resolve_options
    from rankwise.train.config import build_config

    cfg = build_config(overrides=["strategy=deepspeed-zero3", "deepspeed.bucket_size=1000"])
    assert (cfg.deepspeed.zero_stage, cfg.deepspeed.bucket_size) == (3, 1000)
    assert build_config(overrides=["strategy=ddp-spawn"]).launch.launcher == "spawn"
    options = resolve_options(lookup("deepspeed-zero1"), {"bucket_size": 7})
    assert (options.zero_stage, options.bucket_size) == (1, 7)
    with pytest.raises(
        ConfigError, match="'deepspeed-zero3' sets deepspeed.zero_stage=3; it was also given 2"
    ):
        build_config(overrides=["strategy=deepspeed-zero3", "deepspeed.zero_stage=2"])
    with pytest.raises(ConfigError, match="sets deepspeed.zero_stage=1; it was also given 2"):
        resolve_options(lookup("deepspeed-zero1"), {"zero_stage": 2})
    with pytest.raises(ConfigError, match="strategy 'single' takes no options"):
        resolve_options(lookup("single"), {"zero_stage": 2})


def test_an_unknown_option_names_the_one_it_resembles_or_lists_them_all():
    from rankwise.strategies import resolve_options

    with pytest.raises(
        ConfigError, match=r"ddp.bucket_cap: no such option .*; did you mean ddp.bucket_cap_mb\?"
    ):
        resolve_options(lookup("ddp"), {"bucket_cap": 1})
    with pytest.raises(ConfigError, match="deepspeed takes zero_stage, "):
        resolve_options(lookup("deepspeed"), {"zzz": 1})


# What a new strategy touches: its own file.  Collected with a throwaway strategy registered (the
# plugin tests/support/new_strategy.py stands for src/rankwise/strategies/throwaway.py), the
# strategy tests run it with no test file edited: every list of strategies is derived from the
# registry (tests/support/strategies.py: COVERAGE).
NEW_STRATEGY_GETS = {
    "tests/strategies/test_contract.py": [
        "test_every_registered_strategy_satisfies_the_contract[throwaway]"
    ],
    "tests/strategies/test_equivalence.py": [
        "test_two_ranks_match_single_process[toy-mlp-throwaway]",
        "test_two_ranks_match_single_process[tiny-bert-throwaway]",
        "test_gradient_accumulation_matches_the_full_batch[throwaway]",
        "test_gradient_clipping_matches_single_process[throwaway]",
    ],
    "tests/strategies/test_resume.py": [
        "test_resume_after_a_cut_equals_the_uninterrupted_run[throwaway]"
    ],
    "tests/runtime/test_runtime.py": [
        "test_public_loop_resumes_bitwise_and_matches_single[throwaway]"
    ],
    "tests/runtime/test_agreement.py": [
        "test_a_model_each_rank_drew_alone_trains_from_rank_0s_weights_under_every_strategy[throwaway]"
    ],
    "tests/examples/test_own_scripts.py": [
        "test_the_cnn_at_its_optimizers_defaults_is_equivalent_under_every_strategy[throwaway-sgd]",
        "test_the_cnn_at_its_optimizers_defaults_is_equivalent_under_every_strategy[throwaway-adam]",
    ],
}


@pytest.mark.multiproc
def test_a_new_strategy_file_gets_the_contract_equivalence_checkpoint_and_public_loop_tests(
    tmp_path,
):
    """Collect the strategy tests with a throwaway strategy registered and run its contract check
    (in one pytest process; nothing trains): the tests it gets are exactly the lists' new
    entries."""
    collected = tmp_path / "collected.txt"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.support.new_strategy",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            "--collected-to",
            str(collected),
            "-q",
            "-k",
            "throwaway and contract",
            *NEW_STRATEGY_GETS,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )
    got: dict[str, list[str]] = {}
    for nodeid in collected.read_text(encoding="utf-8").splitlines():
        if "throwaway" in nodeid:
            path, name = nodeid.split("::", 1)
            got.setdefault(path, []).append(name)
    assert {path: sorted(names) for path, names in got.items()} == {
        path: sorted(names) for path, names in NEW_STRATEGY_GETS.items()
    }


def test_every_strategy_a_test_leaves_out_is_registered_and_says_why():
    """The exclusions are the one place a strategy is kept out of a test: each names a registered
    strategy (a renamed one would silently be run again, or its exclusion outlive it) and says
    why."""
    from rankwise.strategies import strategy_names
    from tests.support.strategies import COVERAGE, REFERENCE, strategies_for

    for tests, coverage in COVERAGE.items():
        assert set(coverage.left_out) <= set(strategy_names()) and all(
            coverage.left_out.values()
        ), tests
        assert REFERENCE not in strategies_for(tests) and set(coverage.left_out).isdisjoint(
            strategies_for(tests)
        )
    assert strategies_for("equivalence") == [
        "accelerate",
        "ddp",
        "deepspeed",
        "deepspeed-zero3",
        "fsdp",
    ]


THROWAWAY = '''"""A new strategy file: DDP under a name no tool spells, and nothing else edited."""

from rankwise.strategies import register
from rankwise.strategies.ddp import DDP


@register
class Throwaway(DDP):
    name = "throwaway"
    description = "DDP under a name no tool spells"
'''


@pytest.mark.multiproc
@pytest.mark.timeout(1200)  # a plan and a 2-row bench with its check: 100 s alone, 300+ under load
def test_a_new_strategy_file_is_planned_and_benched_with_no_other_file_edited(tmp_path):
    """A copy of the package with one file added, src/rankwise/strategies/throwaway.py: plan's
    default set plans it (as the DDP it subclasses, from the facts DDP's file declares), and bench
    runs it and checks it against single, as a user runs both."""
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "src" / "rankwise", src / "rankwise", ignore=shutil.ignore_patterns("__pycache__")
    )
    (src / "rankwise" / "strategies" / "throwaway.py").write_text(THROWAWAY, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}

    def rankwise(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rankwise.cli", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )

    script = ROOT / "tests/support/tools/watch/scripts/tutorial_ddp.py"
    planned = rankwise(
        "plan", str(script), "--nproc-per-node", "2", "--device", "h100", "--out", "plan"
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    rows = {
        row["strategy"]: row
        for row in json.loads((tmp_path / "plan" / "plan.json").read_text())["rows"]
    }
    assert "throwaway" in rows, sorted(rows)
    for key in ("memory", "collectives"):
        assert rows["throwaway"][key] == rows["ddp"][key], key

    benched = rankwise(
        "bench",
        "--preset",
        "smoke",
        "--strategies",
        "throwaway",
        "--out",
        "bench",
        *(f"--set={setting}" for setting in TINY_TASK),
    )
    assert benched.returncode == 0, benched.stdout[-3000:] + benched.stderr[-3000:]
    report = json.loads((tmp_path / "bench" / "report.json").read_text())
    row = next(row for row in report["rows"] if row["row"] == "throwaway")
    assert row["equivalent"] is True and row["samples_per_s"] > 0, row
    assert row["about"] == "DDP under a name no tool spells"  # its own line, not DDP's


TINY_TASK = ("data.limit=1000", "data.tokenizer=char", "data.max_length=32")
"""The built-in task at a size a test runs in a minute (the smoke preset's 30 steps: fewer move the
accuracy check's 1 point by chance)."""
