"""Resume within a strategy: a run cut after step 4 and resumed ends with exactly the weights of an
uninterrupted run, also where model and optimizer state are sharded (FSDP shards, DeepSpeed ZeRO partitions)."""

import os
import shutil

import pytest

from rankwise.checkpoint import read_weights
from rankwise.config import DataConfig, build_config
from rankwise.data.prepare import PreparedData, prepare_data
from tests.multiproc import run_ranks


def _train(run_dir: str, data_dir: str, strategy: str, *extra: str) -> None:
    from rankwise.loop import run_training

    cfg = build_config(overrides=[f"strategy={strategy}", "model.name=mlp", "data.source=toy", "batch_size=16",
                                  "max_steps=8", "progress=false", "seed=5", *extra])
    run_training(cfg, PreparedData.load(data_dir), run_dir)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    prepare_data(DataConfig(source="toy", toy_samples=800)).save(root)
    return root


@pytest.mark.parametrize("strategy, extra", [("fsdp", ()), ("deepspeed", ("deepspeed.zero_stage=3",))])
def test_resume_after_a_cut_equals_the_uninterrupted_run(strategy, extra, toy, tmp_path):
    run_ranks(_train, 2, str(tmp_path / "full"), str(toy), strategy, *extra)
    run_ranks(_train, 2, str(tmp_path / "cut"), str(toy), strategy, "save_every=4", *extra)
    checkpoints = tmp_path / "cut" / "checkpoints"
    shutil.rmtree(checkpoints / "step-00000008")
    os.remove(checkpoints / "latest")
    os.symlink("step-00000004", checkpoints / "latest")
    run_ranks(_train, 2, str(tmp_path / "cut"), str(toy), strategy, "resume=latest", *extra)
    full, resumed = read_weights(tmp_path / "full"), read_weights(checkpoints)
    difference = max((full[k] - resumed[k]).abs().max().item() for k in full)
    assert difference == 0.0, f"{strategy}: resumed run differs by {difference:.2e}"
