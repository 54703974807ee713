"""Scripts that are not text classification (a causal LM with tied embeddings, a CNN), unchanged, under the
strategy the launcher chooses: the right world size, and the weights one process computes."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from rankwise.checkpoint import read_weights
from rankwise.launch.choice import STRATEGY
from rankwise.tolerance import max_param_diff, tolerance
from tests.multiproc import run_ranks

ROOT = Path(__file__).parents[2]
SCRIPTS = {"causal_lm.py": ["--samples", "256", "--steps", "6", "--batch-size", "16", "--grad-accum", "2"],
           "image_cnn.py": ["--samples", "256", "--steps", "6", "--batch-size", "32"]}


def _run(script: str, strategy: str, out: str, args: list[str]) -> None:
    """One rank: the example's own main, with the launcher's choice in the environment as `rankwise launch`
    leaves it."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, ROOT / "examples" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.environ[STRATEGY] = strategy
    try:
        module.main([*args, "--out", out])
    finally:
        os.environ.pop(STRATEGY, None)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict[str, dict]:
    weights = {}
    for script, args in SCRIPTS.items():
        out = tmp_path_factory.mktemp(Path(script).stem)
        run_ranks(_run, 1, script, "single", str(out), args, timeout=180)
        weights[script] = read_weights(out / "model.safetensors")
    return weights


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed-zero2", "accelerate"])
def test_an_own_script_under_the_launchers_strategy_matches_one_process(script, strategy, single, tmp_path):
    run_ranks(_run, 2, script, strategy, str(tmp_path), SCRIPTS[script], timeout=180)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["strategy"], summary["world_size"], summary["steps"]) == (strategy, 2, 6)
    difference = max_param_diff(read_weights(tmp_path / "model.safetensors"), single[script])
    print(f"{script} {strategy}: max |single - {strategy}| = {difference:.2e}")
    assert difference < tolerance()
