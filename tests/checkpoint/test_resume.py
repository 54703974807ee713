"""Crash-safe checkpoints through ``rt.save_state`` / ``rt.load_state``: a corrupt latest falls back
to the previous one (``strict`` refuses), a crash or a full disk in the middle of a save leaves the
previous checkpoint loadable."""

from __future__ import annotations

import errno
import logging
import os

import pytest
import torch
from torch import nn

import rankwise
from rankwise import checkpoint as ckpt
from tests.support.multiproc import run_ranks


def _model_and_optimizer(rt):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    return rt.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))


def _step(rt, model, optimizer) -> None:
    rt.backward(model(torch.ones(3, 4)).square().mean(), model)
    rt.step(optimizer, model)
    rt.zero_grad(optimizer)


def _saved_twice(root) -> tuple[dict, dict]:
    """Checkpoints after steps 1 and 2 under ``root``; returns the weights at each."""
    with rankwise.setup("single") as rt:
        model, optimizer = _model_and_optimizer(rt)
        weights = []
        for _ in range(2):
            _step(rt, model, optimizer)
            rt.save_state(root, model, optimizer, extra={"note": rt.steps})
            weights.append({k: v.clone() for k, v in rt.state_dict(model).items()})
    return weights[0], weights[1]


def _load(root, strict: bool = False) -> tuple[dict, dict]:
    with rankwise.setup("single") as rt:
        model, optimizer = _model_and_optimizer(rt)
        extra = rt.load_state(root, model, optimizer, strict=strict)
        return extra, rt.state_dict(model)


def _load_warnings(caplog) -> str:
    """What load_state warned (through logging: on stderr for a program that configured none)."""
    return "\n".join(
        record.getMessage()
        for record in caplog.records
        if record.name == "rankwise.checkpoint.resume" and record.levelno == logging.WARNING
    )


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_latest_falls_back_to_the_previous_checkpoint(damage, tmp_path, caplog):
    first, _ = _saved_twice(tmp_path)
    latest = (tmp_path / "latest").resolve() / ckpt.WEIGHTS
    if damage == "truncate":
        os.truncate(latest, latest.stat().st_size // 2)
    else:
        data = bytearray(latest.read_bytes())
        data[-1] ^= 0x01
        latest.write_bytes(bytes(data))
    extra, weights = _load(tmp_path)
    assert extra == {"note": 1, "step": 1}
    assert all(torch.equal(weights[k], first[k]) for k in first)
    warning = _load_warnings(caplog)
    assert "step-00000002 is corrupt: model.safetensors" in warning and "resuming from" in warning
    with pytest.raises(ckpt.CheckpointError, match="step-00000002 is corrupt"):
        _load(tmp_path, strict=True)


def test_a_crash_in_the_middle_of_a_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    first, _ = _saved_twice(tmp_path)
    with rankwise.setup("single") as rt:
        model, optimizer = _model_and_optimizer(rt)
        rt.load_state(tmp_path, model, optimizer)
        _step(rt, model, optimizer)
        real_save = torch.save

        def crash_after_the_optimizer_state(obj, path, *args, **kwargs):
            real_save(obj, path, *args, **kwargs)
            if str(path).endswith(ckpt.STATE):
                raise KeyboardInterrupt("the process dies here")

        monkeypatch.setattr(torch, "save", crash_after_the_optimizer_state)
        with pytest.raises(KeyboardInterrupt):
            rt.save_state(tmp_path, model, optimizer)
    assert (tmp_path / ".tmp-step-00000003").is_dir()  # the half-written staging directory
    assert (tmp_path / "latest").resolve().name == "step-00000002"
    monkeypatch.undo()
    extra, _ = _load(tmp_path)
    assert extra["step"] == 2
    _saved_twice(tmp_path / "again")  # and saving still works


def test_keep_limits_the_checkpoints_kept(tmp_path):
    with rankwise.setup("single") as rt:
        model, optimizer = _model_and_optimizer(rt)
        for _ in range(4):
            _step(rt, model, optimizer)
            rt.save_state(tmp_path, model, optimizer, keep=3)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [
        "step-00000002",
        "step-00000003",
        "step-00000004",
    ]


def _disk_full_on_rank_0(root: str) -> str:
    with rankwise.setup("ddp") as rt:
        model, optimizer = _model_and_optimizer(rt)
        _step(rt, model, optimizer)
        rt.save_state(root, model, optimizer)
        _step(rt, model, optimizer)
        if rt.rank == 0:
            real_save = torch.save

            def full(obj, path, *args, **kwargs):
                if isinstance(path, os.PathLike) and str(path).endswith("optimizer.pt"):
                    raise OSError(errno.ENOSPC, "No space left on device", str(path))
                # collectives pickle through torch.save too
                return real_save(obj, path, *args, **kwargs)

            torch.save = full  # this rank process only (a fresh one: fresh=True)
        try:
            rt.save_state(root, model, optimizer)
        except ckpt.CheckpointError as e:
            return str(e)
        return "saved"


@pytest.mark.multiproc
def test_a_full_disk_names_rank_and_path_and_keeps_the_previous_checkpoint(tmp_path):
    messages = run_ranks(_disk_full_on_rank_0, 2, str(tmp_path), fresh=True)
    for message in messages:  # both ranks give up the checkpoint together, with the same message
        assert "checkpoint of step 2 not written: rank 0: cannot write" in message, message
        assert (
            "optimizer.pt: No space left on device" in message and "previous checkpoint" in message
        )
    assert not list(tmp_path.glob(".tmp-*"))  # no partial files
    assert (tmp_path / "latest").resolve().name == "step-00000001"
    ckpt.verify((tmp_path / "latest").resolve())


def test_a_dangling_latest_falls_back_to_the_step_directories(tmp_path, caplog):
    first, _ = _saved_twice(tmp_path)
    import shutil

    shutil.rmtree(tmp_path / "step-00000002")  # latest now points at nothing
    extra, weights = _load(tmp_path)
    assert extra["step"] == 1 and all(torch.equal(weights[k], first[k]) for k in first)
    assert "trying the checkpoints in" in _load_warnings(caplog)


def test_resuming_from_an_earlier_checkpoint_never_prunes_what_it_writes(tmp_path):
    """Steps 1 and 5 saved; a run resumed from step 1 saves step 3 with keep=1.  Pruning by name
    alone deleted steps 1 and 3 (the one just written, leaving `latest` dangling); now the older
    step 1 goes, step 3 stays, and step 5 (another timeline) is left for the user."""
    with rankwise.setup("single") as rt:
        model, optimizer = _model_and_optimizer(rt)
        _step(rt, model, optimizer)
        rt.save_state(tmp_path, model, optimizer, step=1)
        rt.save_state(tmp_path, model, optimizer, step=5)
        rt.load_state(tmp_path / "step-00000001", model, optimizer)
        written = rt.save_state(tmp_path, model, optimizer, step=3, keep=1)
    assert written.is_dir() and (tmp_path / "latest").resolve() == written.resolve()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003", "step-00000005"]


def _unpicklable_extra(root: str) -> str:
    with rankwise.setup("ddp") as rt:
        model, optimizer = _model_and_optimizer(rt)
        _step(rt, model, optimizer)
        try:
            rt.save_state(root, model, optimizer, extra={"callback": lambda: None})
        except ckpt.CheckpointError as e:
            return str(e)
        return "saved"


@pytest.mark.multiproc
def test_an_error_on_rank_0_while_saving_reaches_every_rank_instead_of_a_hang(tmp_path):
    messages = run_ranks(_unpicklable_extra, 2, str(tmp_path), timeout=60)
    assert all("checkpoint of step 1 not written: rank 0: cannot write" in m for m in messages), (
        messages
    )
    assert not list(tmp_path.glob(".tmp-*")) and not list(tmp_path.glob("step-*"))
