"""Whole optimizer state in torch's two spellings, and FSDP's shards read back whole.

Whole-state strategies save ``optimizer.state_dict()``: states keyed by each parameter's index in
the optimizer's groups.  FSDP saves, through ``torch.distributed.checkpoint.state_dict``, states
keyed by parameter name (sharded tensors, written per rank by DCP).  A checkpoint moves between the
two through the names: the script builds the same optimizer over the same model on both sides, so
the i-th parameter of the optimizer is the same named parameter.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

from rankwise.errors import CheckpointError


def parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The name of every parameter of each of ``optimizer``'s groups, in the optimizer's order (``model``
    unwrapped, holding the very parameters the optimizer steps)."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    try:
        return [[names[id(parameter)] for parameter in group["params"]] for group in optimizer.param_groups]
    except KeyError:
        raise CheckpointError("the optimizer steps a parameter the model lacks: its state has no name") from None


def _check_groups(state: dict, names: list[list[str]]) -> None:
    saved, expected = [len(group["params"]) for group in state["param_groups"]], [len(group) for group in names]
    if saved != expected:
        raise CheckpointError(f"the checkpoint's optimizer has groups of {saved} parameters, this run's optimizer "
                              f"groups of {expected}: build the same optimizer to resume")


def by_name(state: dict, names: list[list[str]]) -> dict:
    """``optimizer.state_dict()`` (keyed by index) keyed by parameter name instead."""
    _check_groups(state, names)
    name_of = {index: name for group, group_names in zip(state["param_groups"], names, strict=True)
               for index, name in zip(group["params"], group_names, strict=True)}
    return {"state": {name_of[index]: value for index, value in state["state"].items()},
            "param_groups": [{**group, "params": [name_of[i] for i in group["params"]]}
                             for group in state["param_groups"]]}


def by_index(state: dict, names: list[list[str]]) -> dict:
    """Optimizer state keyed by parameter name keyed by this optimizer's indices, for ``load_state_dict``."""
    _check_groups(state, names)
    index_of = {name: index for index, name in enumerate(name for group in names for name in group)}
    missing = sorted({name for group in state["param_groups"] for name in group["params"]} - set(index_of))
    if missing:
        raise CheckpointError(f"the checkpoint's optimizer holds state of {missing[:5]}, which this model lacks")
    return {"state": {index_of[name]: value for name, value in state["state"].items()},
            "param_groups": [{**group, "params": [index_of[name] for name in group["params"]]}
                             for group in state["param_groups"]]}


def read_sharded(directory: Path) -> dict:
    """FSDP's DCP checkpoint (``directory``) read back whole in this process: ``{"model": ..., "optim": ...}``
    with full tensors, the optimizer keyed by parameter name."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="rankwise-unshard-") as tmp:
        dcp_to_torch_save(directory, Path(tmp) / "whole.pt")
        return torch.load(Path(tmp) / "whole.pt", map_location="cpu", weights_only=False)
