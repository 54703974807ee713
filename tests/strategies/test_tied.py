"""Tied parameters (a causal LM whose output layer is its input embedding, as in GPT-2) save and
load under every strategy: one copy on disk, the tie restored on load, export unaffected."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rankwise.checkpoint import read_weights
from tests.support.multiproc import run_ranks

TIED = ("lm_head.weight", "transformer.wte.weight")


def tied_lm(seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        tie_word_embeddings=True,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    return model


def _prepared(rt, seed: int):
    model = tied_lm(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return rt.prepare(model, optimizer, micro_batch_size=2)


def _train_and_save(strategy: str, out: str) -> dict | None:
    import rankwise

    with rankwise.setup(strategy, seed=0) as rt:
        model, optimizer = _prepared(rt, seed=0)
        tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(rt.rank))
        for _ in range(2):
            batch = rt.to_device(tokens)
            rt.backward(model(input_ids=batch, labels=batch).loss, model)
            rt.step(optimizer, model)
            rt.zero_grad(optimizer)
        trained = rt.state_dict(model)
        rt.save_weights(model, Path(out) / "weights.safetensors")
        rt.save_state(Path(out) / "checkpoints", model, optimizer)
        return {"trained": trained} if rt.is_main else None


def _load(strategy: str, out: str) -> dict | None:
    import rankwise

    with rankwise.setup(strategy, seed=0) as rt:
        model, optimizer = _prepared(rt, seed=1)  # other weights: loading must replace them
        rt.load_state(Path(out) / "checkpoints", model, optimizer)
        inner = rt.strategy.unwrap(model)
        tied = inner.lm_head.weight is inner.transformer.wte.weight
        loaded = rt.state_dict(model)
        return {"loaded": loaded, "tied": tied} if rt.is_main else None


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("strategy", "ranks"), [("single", 1), ("ddp", 2), ("fsdp", 2), ("deepspeed-zero3", 2)]
)
def test_tied_weights_save_once_and_load_tied(strategy, ranks, tmp_path):
    trained = run_ranks(_train_and_save, ranks, strategy, str(tmp_path), timeout=180)[0]["trained"]
    for path in (
        tmp_path / "weights.safetensors",
        tmp_path / "checkpoints" / "latest" / "model.safetensors",
    ):
        with safe_open(str(path), framework="pt") as handle:
            assert len(set(TIED) & set(handle.keys())) == 1, (
                f"{path}: the tied tensor is stored twice"
            )
        weights = read_weights(path)
        assert weights.keys() == trained.keys()
        assert weights[TIED[0]] is weights[TIED[1]]  # the tie comes back as one tensor
        assert all(torch.equal(weights[k], trained[k]) for k in trained)
    loaded = run_ranks(_load, ranks, strategy, str(tmp_path), timeout=180)[0]
    assert loaded["tied"], f"{strategy}: the loaded model's output layer is no longer its embedding"
    assert all(torch.equal(loaded["loaded"][k], trained[k]) for k in trained), strategy


def test_export_and_init_weights_keep_the_tie(tmp_path):
    import json

    from rankwise import checkpoint as ckpt
    from rankwise.train import artifacts

    model = tied_lm(0)
    ckpt.commit_checkpoint(
        tmp_path,
        1,
        weights=model.state_dict(),
        training_state={"step": 1},
        files={
            artifacts.CONFIG: json.dumps({"data": {"max_length": 16}}),
            artifacts.MODEL_SPEC: "{}",
            artifacts.LABELS: "[]",
        },
    )
    exported = artifacts.export(tmp_path / "latest", tmp_path / "model.safetensors")
    with safe_open(str(exported), framework="pt") as handle:
        assert len(set(TIED) & set(handle.keys())) == 1
    weights = artifacts.load_checkpoint(exported).weights
    fresh = tied_lm(1)
    fresh.load_state_dict(weights)  # what model.init_weights does
    assert fresh.lm_head.weight is fresh.transformer.wte.weight
    assert torch.equal(fresh.lm_head.weight, model.lm_head.weight)
