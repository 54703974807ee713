import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from rankwise.checkpoint import read_weights
from rankwise.data.prepare import prepare_data
from rankwise.measure.memory import peak_rss_megabytes
from rankwise.models.bert import build_bert
from rankwise.train.config import ConfigError, DataConfig, build_config
from rankwise.train.loop import run_training
from rankwise.train.optim import lr_lambda, parameter_groups


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return prepare_data(DataConfig(source="toy", toy_samples=600))


def _cfg(*overrides):
    return build_config(
        overrides=[
            "strategy=single",
            "model.name=mlp",
            "data.source=toy",
            "batch_size=16",
            "progress=false",
            "seed=3",
            *overrides,
        ]
    )


def test_resume_ends_with_the_weights_and_logs_of_an_uninterrupted_run(toy, tmp_path):
    full = run_training(_cfg("max_steps=8", "log_every=2"), toy, tmp_path / "full")
    assert full["steps"] == 8
    run_training(_cfg("max_steps=8", "save_every=4", "log_every=2"), toy, tmp_path / "cut")
    # Pretend the run died after step 4: drop the later checkpoint and point latest back.
    checkpoints = tmp_path / "cut" / "checkpoints"
    shutil.rmtree(checkpoints / "step-00000008")
    os.remove(checkpoints / "latest")
    os.symlink("step-00000004", checkpoints / "latest")
    resumed = run_training(
        _cfg("max_steps=8", "resume=latest", "log_every=2"), toy, tmp_path / "cut"
    )
    assert resumed["steps"] == 8
    a, b = read_weights(tmp_path / "full" / "checkpoints"), read_weights(checkpoints)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # Steps 5-8 were logged twice in all; each log must hold them once, as the uninterrupted run
    # does.
    assert _metrics(tmp_path / "cut") == _metrics(tmp_path / "full")
    assert [r["step"] for r in _metrics(tmp_path / "full") if "loss" in r] == [2, 4, 6, 8]
    assert _tensorboard_steps(tmp_path / "cut", "loss") == [2, 4, 6, 8]


def test_a_new_run_in_a_used_directory_replaces_its_logs(toy, tmp_path):
    run_training(_cfg("max_steps=4", "log_every=2"), toy, tmp_path)
    first = _metrics(tmp_path)
    run_training(_cfg("max_steps=4", "log_every=2", "seed=4"), toy, tmp_path)
    second = _metrics(tmp_path)
    assert [r["step"] for r in second] == [r["step"] for r in first]
    assert second != first  # the second run's own records, not the first's kept
    assert _tensorboard_steps(tmp_path, "loss") == [2, 4]


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _tensorboard_steps(run_dir, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def test_batch_larger_than_the_data_is_a_clear_error(toy, tmp_path):
    with pytest.raises((ConfigError, ValueError), match="lower"):
        run_training(_cfg("batch_size=4096"), toy, tmp_path)


def test_no_weight_decay_on_bias_and_layernorm():
    model, _ = build_bert(
        "tiny", num_labels=2, dropout=0.0, vocab_size=100, pad_id=0, max_length=16
    )
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(
        names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in no_decay["params"]
    )
    assert any("LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert all(p.ndim == 2 for p in decay["params"])


def test_schedule_warms_up_then_decays():
    f = lr_lambda("linear", warmup_steps=10, total_steps=110)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0) and f(60) == pytest.approx(0.5)
    assert f(110) == pytest.approx(0.0)
    c = lr_lambda("cosine", warmup_steps=0, total_steps=100)
    assert c(0) == pytest.approx(1.0) and c(50) == pytest.approx(0.5)


@pytest.mark.multiproc
def test_a_child_reports_its_own_peak_not_its_parents():
    """ru_maxrss survives fork+exec; the reported peak must not (a launched worker would show its
    launcher's)."""
    ballast = bytearray(1024 * 1024 * 1024)  # this process's peak is now above 1 GB
    ballast[::4096] = b"x" * len(ballast[::4096])
    probe = "from rankwise.measure.memory import peak_rss_megabytes as p; print(p())"
    child = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    del ballast
    assert peak_rss_megabytes() > 1024
    assert float(child.stdout.strip().splitlines()[-1]) < peak_rss_megabytes() - 600


@pytest.fixture
def cudnn_attention_restored():
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(enabled)


def test_cudnn_attention_is_off_for_cuda_training_only(cudnn_attention_restored):
    """On CUDA torch's cuDNN attention plans every new sequence length anew (0.17-2.3 s a step on an
    H100), and `rankwise train` batches change length every step: the training app turns that
    backend off."""
    from rankwise.train.loop import attention_for_varying_lengths

    torch.backends.cuda.enable_cudnn_sdp(True)
    attention_for_varying_lengths(torch.device("cpu"))
    assert torch.backends.cuda.cudnn_sdp_enabled()  # a CPU run changes nothing
    attention_for_varying_lengths(torch.device("cuda", 0))
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_the_trainer_sets_attention_up_for_its_device(
    toy, tmp_path, monkeypatch, cudnn_attention_restored
):
    import rankwise.train.loop as loop

    seen = []
    monkeypatch.setattr(loop, "attention_for_varying_lengths", seen.append)
    run_training(_cfg("max_steps=1"), toy, tmp_path)
    assert seen == [torch.device("cpu")]
