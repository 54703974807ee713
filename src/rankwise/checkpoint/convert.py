"""Whole optimizer state in torch's two spellings: keyed by index, and keyed by parameter name.

``optimizer.state_dict()`` keys each parameter's state by its index in the optimizer's groups; the
whole state every strategy reads its checkpoints back into (``Strategy.read_whole_state``) keys it
by parameter name.  A checkpoint moves between strategies through the names: the script builds the
same optimizer over the same model on both sides, so the i-th parameter of the optimizer is the same
named parameter.
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise.errors import CheckpointError


def parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The name of every parameter of each of ``optimizer``'s groups, in the optimizer's order
    (``model`` unwrapped, holding the very parameters the optimizer steps)."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    try:
        return [
            [names[id(parameter)] for parameter in group["params"]]
            for group in optimizer.param_groups
        ]
    except KeyError:
        raise CheckpointError(
            "the optimizer steps a parameter the model lacks: its state has no name"
        ) from None


def _check_groups(state: dict, names: list[list[str]]) -> None:
    saved, expected = (
        [len(group["params"]) for group in state["param_groups"]],
        [len(group) for group in names],
    )
    if saved != expected:
        raise CheckpointError(
            f"the checkpoint's optimizer has groups of {saved} parameters, this run's optimizer "
            f"groups of {expected}: build the same optimizer to resume"
        )


def by_name(state: dict, names: list[list[str]]) -> dict:
    """``optimizer.state_dict()`` (keyed by index) keyed by parameter name instead."""
    _check_groups(state, names)
    name_of = {
        index: name
        for group, group_names in zip(state["param_groups"], names, strict=True)
        for index, name in zip(group["params"], group_names, strict=True)
    }
    return {
        "state": {name_of[index]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [name_of[i] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def by_index(state: dict, names: list[list[str]]) -> dict:
    """Optimizer state keyed by parameter name keyed by this optimizer's indices, for
    ``load_state_dict``."""
    _check_groups(state, names)
    index_of = {name: index for index, name in enumerate(name for group in names for name in group)}
    missing = sorted(
        {name for group in state["param_groups"] for name in group["params"]} - set(index_of)
    )
    if missing:
        raise CheckpointError(
            f"the checkpoint's optimizer holds state of {missing[:5]}, which this model lacks"
        )
    return {
        "state": {index_of[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [index_of[name] for name in group["params"]]}
            for group in state["param_groups"]
        ],
    }
