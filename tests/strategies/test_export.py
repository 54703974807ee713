"""Checkpoint -> export -> one plain process: identical predictions, whatever strategy trained the model."""

import json

import pytest

from rankwise.checkpoint import export, load_checkpoint
from rankwise.config import DataConfig, build_config
from rankwise.data.prepare import PreparedData, prepare_data
from rankwise.evaluate import gather_predictions
from rankwise.models import model_from_spec
from tests.multiproc import run_ranks


def _train(run_dir: str, data_dir: str, strategy: str) -> None:
    from rankwise.loop import run_training

    cfg = build_config(overrides=[f"strategy={strategy}", "max_steps=4", "batch_size=16", "progress=false",
                                  "data.max_length=32", "deepspeed.zero_stage=3", "seed=1"])
    run_training(cfg, PreparedData.load(data_dir), run_dir)


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    prepare_data(DataConfig(source="sentiment", tokenizer="bpe", vocab_size=2000, max_length=32, limit=300)).save(root)
    return root


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed", "accelerate"])
def test_exported_weights_reproduce_the_runs_predictions(strategy, text_data, tmp_path):
    import rankwise

    run_ranks(_train, 2, str(tmp_path / "run"), str(text_data), strategy)
    exported = export(tmp_path / "run" / "checkpoints" / "latest", tmp_path / "model.safetensors")
    loaded = load_checkpoint(exported)
    model = model_from_spec(loaded.model_spec)
    model.load_state_dict(loaded.weights)  # strict: every key present, no module. prefix

    data = PreparedData.load(text_data)
    dataset = data.dataset("test")
    with rankwise.setup("single") as rt:
        predictions, _ = gather_predictions(rt, model, dataset, 64, dataset.collate)
    names = loaded.label_names
    run_predictions = [json.loads(line)["prediction"]
                       for line in (tmp_path / "run" / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(run_predictions) == len(dataset) == 300  # exact evaluation count under this strategy
    assert [names[i] for i in predictions.tolist()] == run_predictions
