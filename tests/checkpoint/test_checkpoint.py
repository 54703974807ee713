import json
import os

import pytest
import torch

from rankwise import checkpoint as ckpt
from rankwise.models.toy_nets import ToyMLP
from rankwise.train import artifacts


def save(root, step, model, **extra):
    spec = {"kind": "toy", "name": "mlp", "features": 4, "num_labels": 3, "dropout": 0.0}
    return ckpt.commit_checkpoint(
        root,
        step,
        weights=model.state_dict(),
        training_state={"step": step, **extra},
        files={
            artifacts.CONFIG: json.dumps({"data": {"max_length": 8}}),
            artifacts.MODEL_SPEC: json.dumps(spec),
            artifacts.LABELS: json.dumps(["a", "b", "c"]),
        },
    )


def test_round_trip_and_latest_pointer(tmp_path):
    model = ToyMLP(4, 3)
    first = save(tmp_path, 10, model)
    with torch.no_grad():
        model.net2.weight.add_(1.0)
    second = save(tmp_path, 20, model)
    assert (tmp_path / "latest").resolve() == second.resolve() and first.exists()
    loaded = artifacts.load_checkpoint(tmp_path / "latest")
    assert torch.equal(loaded.weights["net2.weight"], model.net2.weight)
    assert loaded.training_state()["step"] == 20 and loaded.label_names == ["a", "b", "c"]
    # A run directory or its checkpoints folder resolve to the newest checkpoint too.
    assert ckpt.resolve(tmp_path) == second.resolve()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], (
        "temporary files left behind"
    )


def test_old_checkpoints_are_pruned(tmp_path):
    model = ToyMLP(4, 3)
    for step in (1, 2, 3, 4):
        save(tmp_path, step, model)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003", "step-00000004"]


def test_module_prefixed_weights_load(tmp_path):
    model = ToyMLP(4, 3)
    prefixed = {f"module.{k}": v for k, v in model.state_dict().items()}
    torch.save(prefixed, tmp_path / "ddp.pt")
    fresh = ToyMLP(4, 3)
    fresh.load_state_dict(ckpt.read_weights(tmp_path / "ddp.pt"))
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values())
    )
    ckpt.write_weights(prefixed, tmp_path / "plain.safetensors")
    assert set(ckpt.read_weights(tmp_path / "plain.safetensors")) == set(model.state_dict())


def test_corruption_is_detected(tmp_path):
    path = save(tmp_path, 5, ToyMLP(4, 3))
    with open(path / ckpt.WEIGHTS, "r+b") as handle:
        handle.seek(-4, os.SEEK_END)
        handle.write(b"\x00\x01\x02\x03")
    with pytest.raises(ckpt.CheckpointError, match="corrupt: model.safetensors"):
        artifacts.load_checkpoint(path)


def test_incomplete_directory_is_not_a_checkpoint(tmp_path):
    (tmp_path / "step-00000001").mkdir()
    with pytest.raises(ckpt.CheckpointError, match="not a complete rankwise checkpoint"):
        artifacts.load_checkpoint(tmp_path / "step-00000001")


def test_a_corrupt_latest_falls_back_to_an_older_checkpoint_never_a_newer_timeline(tmp_path):
    model = ToyMLP(4, 3)
    save(tmp_path, 1, model)
    # another timeline's newer step (e.g. a run resumed from step 1 and then stopped)
    save(tmp_path, 5, model)
    latest = save(tmp_path, 3, model)
    assert (tmp_path / "latest").resolve() == latest.resolve() and (
        tmp_path / "step-00000005"
    ).is_dir()
    (latest / ckpt.MANIFEST).write_text("{truncated", encoding="utf-8")
    found, warnings = ckpt.find_loadable(tmp_path / "latest")
    assert found.name == "step-00000001" and "unreadable manifest.json" in warnings[0]
    with pytest.raises(ckpt.CheckpointError, match="unreadable manifest.json"):
        ckpt.manifest_meta(tmp_path / "latest")


def test_every_known_strategy_continues_every_other_at_any_world_size_and_the_unknown_is_refused():
    from rankwise.checkpoint import check_compatible
    from rankwise.errors import ConfigError
    from rankwise.strategies import portable

    assert (
        portable("ddp", "single")
        and portable("ddp-spawn", "accelerate")
        and portable("single", "horovod")
    )
    assert portable("fsdp", "fsdp") and portable("ddp", "fsdp") and portable("fsdp", "single")
    assert portable("deepspeed-zero2", "ddp") and portable("fsdp", "deepspeed-zero3")
    assert portable("deepspeed-zero2", "deepspeed-zero3") and not portable("gone", "ddp")
    check_compatible("ckpt", {"world_size": 2, "strategy": "ddp"}, "ddp", 3, portable=True)
    check_compatible("ckpt", {"world_size": 2, "strategy": "fsdp"}, "fsdp", 2)
    with pytest.raises(
        ConfigError, match="written at world size 2, this run has 3, and fsdp's state is sharded"
    ):
        check_compatible("ckpt", {"world_size": 2, "strategy": "fsdp"}, "fsdp", 3)
    with pytest.raises(ConfigError, match="written by strategy 'ddp'"):
        check_compatible("ckpt", {"world_size": 2, "strategy": "ddp"}, "fsdp", 2)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_weights_and_checkpoints_get_the_mode_the_umask_gives_every_other_file(tmp_path, umask):
    """safetensors writes its file 0600 and the atomic rename kept it: a serving process of another
    user could not read the weights.  Every file rankwise writes gets what the user's umask gives
    (0644 under 022)."""
    previous = os.umask(umask)
    try:
        weights = ckpt.write_weights(ToyMLP(4, 3).state_dict(), tmp_path / "model.safetensors")
        checkpoint = save(tmp_path / "checkpoints", 10, ToyMLP(4, 3))
        report = ckpt.write_text_atomic(tmp_path / "report.json", "{}")
    finally:
        os.umask(previous)
    expected = 0o666 & ~umask
    modes = {
        path.name: oct(path.stat().st_mode & 0o777)
        for path in [weights, report, *(p for p in checkpoint.rglob("*") if p.is_file())]
    }
    assert set(modes.values()) == {oct(expected)}, modes
    assert ckpt.atomic_files.user_file_mode() == 0o666 & ~previous
