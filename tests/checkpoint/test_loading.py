"""Loading a checkpoint runs no code from it: a planted pickle is refused before anything in it
runs, unless the user says they trust it; rankwise's and DeepSpeed's own files load under torch's
weights-only unpickler."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from rankwise import checkpoint as ckpt
from rankwise.checkpoint import loading
from rankwise.errors import CheckpointError


class _RunsCode:
    """What an attacker puts in a checkpoint: unpickling it calls os.system."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _planted(path: Path, marker: Path) -> Path:
    torch.save({"step": 3, "scheduler": None, "extra": _RunsCode(marker)}, path)
    return path


def test_a_planted_pickle_is_refused_before_it_runs_and_runs_only_when_trusted(
    tmp_path, monkeypatch
):
    marker = tmp_path / "ran"
    path = _planted(tmp_path / "training_state.pt", marker)
    monkeypatch.delenv(loading.TRUST_ENV, raising=False)
    with pytest.raises(
        CheckpointError,
        match=r"names posix\.system, which loading it would import and run.*"
        r"RANKWISE_TRUST_CHECKPOINT=1",
    ):
        loading.load(path, "training-state")
    with pytest.raises(CheckpointError, match="posix.system"):
        loading.check_safe([path], "DeepSpeed")  # before handing a folder to DeepSpeed's own loader
    assert not marker.exists()
    # The refusal is real: the user's word loads it fully, and the planted code runs.
    monkeypatch.setenv(loading.TRUST_ENV, "1")
    loading.load(path)
    assert marker.exists()


def test_resuming_from_a_checkpoint_with_a_planted_training_state_is_refused(tmp_path, monkeypatch):
    from torch import nn

    import rankwise

    monkeypatch.delenv(loading.TRUST_ENV, raising=False)
    with rankwise.setup("single", seed=0) as rt:
        model = nn.Linear(4, 2)
        model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters()))
        saved = rt.save_state(tmp_path / "checkpoints", model, optimizer, step=1)
    marker = tmp_path / "ran"
    _planted(Path(saved) / ckpt.STATE, marker)
    manifest = ckpt.protocol._read_manifest(Path(saved))  # the attacker rewrites the checksums too
    manifest["files"][ckpt.STATE] = {
        "size": (Path(saved) / ckpt.STATE).stat().st_size,
        "sha256": ckpt.atomic_files.sha256_of(Path(saved) / ckpt.STATE),
    }
    (Path(saved) / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with rankwise.setup("single", seed=0) as rt:
        model = nn.Linear(4, 2)
        model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters()))
        with pytest.raises(CheckpointError, match="posix.system"):
            rt.load_state(saved, model, optimizer)
    assert not marker.exists()


def test_rankwise_own_training_state_loads_weights_only_with_its_rng(tmp_path, monkeypatch):
    monkeypatch.delenv(loading.TRUST_ENV, raising=False)
    state = {"step": 7, "rng": [ckpt.rng_state()], "loaders": [{"epoch": 1, "position": 32}]}
    torch.save(state, tmp_path / "training_state.pt")
    loaded = loading.load(tmp_path / "training_state.pt")
    assert loaded["step"] == 7 and loaded["loaders"] == state["loaders"]
    assert np.array_equal(loaded["rng"][0]["numpy"][1], state["rng"][0]["numpy"][1])
    assert torch.equal(loaded["rng"][0]["torch"], state["rng"][0]["torch"])
