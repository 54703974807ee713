"""Adding a strategy with a checkpoint format of its own is one file: this one.  ``ddp-by-name`` is
DDP whose checkpoints keep the optimizer state by parameter name in safetensors (no pickle) beside a
JSON of the groups; it is registered only inside this test's calls.  Through the contract alone
(``claims``, ``save_state``, ``read_whole_state``) its checkpoints continue under another strategy,
and it continues theirs, within the tolerance every other strategy pair meets, at the model's and
optimizer's defaults."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from typing_extensions import override

from rankwise import strategies
from rankwise.checkpoint import WEIGHTS, CheckpointError, read_weights
from rankwise.checkpoint.convert import by_name
from rankwise.measure.tolerance import EXACT, max_param_diff
from rankwise.strategies.ddp import DDP
from tests.support.multiproc import run_ranks
from tests.support.strategies import cut_back, overrides_of_nothing, train_toy, unmarked_overrides


class ByNameDDP(DDP):
    name = "ddp-by-name"
    description = (
        "DDP whose checkpoints keep optimizer state by parameter name in safetensors (a test's "
        "strategy)"
    )
    FOLDER = "by-name"

    @classmethod
    @override
    def claims(cls, directory: Path) -> bool:
        return (directory / cls.FOLDER).is_dir()

    @override
    def save_state(self, directory: Path, model: nn.Module, optimizer) -> None:
        # the state is whole on every rank: rank 0 writes it
        if optimizer is None or not self.env.is_main:
            return
        state = by_name(optimizer.state_dict(), self.optimizer_names(self.unwrap(model), optimizer))
        folder = directory / self.FOLDER
        folder.mkdir()
        save_file(
            {
                f"{name}/{key}": value.contiguous()
                for name, states in state["state"].items()
                for key, value in states.items()
            },
            str(folder / "state.safetensors"),
        )
        (folder / "groups.json").write_text(json.dumps(state["param_groups"]), encoding="utf-8")

    @classmethod
    @override
    def read_whole_state(cls, directory: Path, module: nn.Module, names: list[list[str]] | None):
        weights = read_weights(directory / WEIGHTS)
        if names is None:
            return weights, None
        folder = directory / cls.FOLDER
        if not folder.is_dir():
            raise CheckpointError(f"{directory} holds no {cls.FOLDER}/ optimizer state")
        state: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in load_file(str(folder / "state.safetensors")).items():
            name, _, entry = key.rpartition("/")
            state.setdefault(name, {})[entry] = value
        return weights, {
            "state": state,
            "param_groups": json.loads((folder / "groups.json").read_text()),
        }


@contextlib.contextmanager
def registered(cls: type[strategies.Strategy]):
    """``cls`` registered for the duration of the block only (the registry is process-wide)."""
    # discover the built-in strategies first: the flag would skip them later
    strategies.strategy_names()
    strategies.register(cls)
    try:
        yield
    finally:
        strategies._REGISTRY.pop(cls.name)
        strategies._VARIANTS.pop(cls.name)


def _train_with_toy(*args: str) -> None:
    with registered(ByNameDDP):
        train_toy(*args)


def test_the_toy_strategy_satisfies_the_contract():
    with registered(ByNameDDP):
        assert strategies.get_strategy("ddp-by-name") is ByNameDDP and strategies.portable(
            "ddp-by-name", "fsdp"
        )
        assert not unmarked_overrides(ByNameDDP) and not overrides_of_nothing(ByNameDDP)
    assert "ddp-by-name" not in strategies.strategy_names()


def _continue(written_by: str, strategy: str, data: Path, run: Path) -> float:
    """Train 8 steps with ``written_by`` on 2 ranks, cut back to step 4, resume with ``strategy`` on
    2 ranks, the model at its defaults (dropout on: each rank's generator state comes back with the
    checkpoint): the largest weight difference from the uninterrupted run."""
    run_ranks(_train_with_toy, 2, str(run), str(data), written_by)
    checkpoints = run / "checkpoints"
    if written_by == ByNameDDP.name:
        assert ByNameDDP.claims(checkpoints / "step-00000004")  # its own format, nothing else's
        assert not (checkpoints / "step-00000004" / "optimizer.pt").exists()
    uninterrupted = cut_back(checkpoints, "step-00000008", "step-00000004")
    run_ranks(_train_with_toy, 2, str(run), str(data), strategy, "resume=latest")
    resumed = read_weights(checkpoints)
    # steps 5-8 really ran
    assert max_param_diff(read_weights(checkpoints / "step-00000004"), resumed) > 0
    return max_param_diff(uninterrupted, resumed)


@pytest.mark.multiproc
def test_the_toy_strategy_resumes_across_strategies(toy, tmp_path):
    assert _continue("ddp-by-name", "fsdp", toy, tmp_path / "to-fsdp") <= EXACT
    assert _continue("fsdp", "ddp-by-name", toy, tmp_path / "from-fsdp") <= EXACT
