"""The models a watched script runs forward: dropout switched off at a model's first forward (unless
kept), what the model says about the run (the watcher's ``facts``), and its parameters' names
without the wrappers' prefixes."""

from __future__ import annotations

import weakref

import torch
from torch import nn

from rankwise.tools.step_trace import model_facts, switch_off_dropout, uses_tf32
from rankwise.tools.watch.records import WatchedFacts

WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_forward_module.", "_fsdp_wrapped_module.")
"""What wrappers (DDP, torch.compile, Fabric, FSDP1) put in front of a parameter's name."""


def new_facts(keep_dropout: bool) -> WatchedFacts:
    """What the run is, before it ran (written as the trace's ``facts.json``;
    :mod:`rankwise.tools.watch.runtime` and the frameworks' adapters fill in what they know)."""
    return {
        "dropout": [],
        "dropout_kept": keep_dropout,
        "half_params": [],
        "batch_dependent": [],
        "precision": "32-true",
        "device": "cpu",
        "comm_hook": "none",
        "tf32": False,
        "shards_optimizer_state": False,
        "api": "torch",
    }


class ModelWatch:
    def __init__(self, facts: WatchedFacts, keep_dropout: bool) -> None:
        self.facts, self.keep_dropout = facts, keep_dropout
        self.refs: list[weakref.ref[nn.Module]] = []
        """The models seen, in the order of their first forward."""
        self.names: dict[int, str] = {}
        """id(parameter) -> its name in the first model that holds it, unwrapped."""

    def new(self, module: nn.Module) -> bool:
        return not any(ref() is module for ref in self.refs)

    def live(self) -> list[nn.Module]:
        return [model for model in (ref() for ref in self.refs) if model is not None]

    def seen(self, model: nn.Module) -> list[tuple[str, torch.Tensor]]:
        """A model's first forward (before it runs): dropout off, its facts; its parameters by
        name."""
        self.refs.append(weakref.ref(model))
        facts = self.facts
        facts["dropout"] += switch_off_dropout(model, self.keep_dropout)
        facts["batch_dependent"] = sorted(
            set(facts["batch_dependent"]) | set(model_facts(model)["batch_dependent"])
        )
        parameters = list(model.parameters())
        facts["half_params"] = sorted(
            set(facts["half_params"])
            | {
                str(p.dtype).removeprefix("torch.")
                for p in parameters
                if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16)
            }
        )
        if parameters:
            facts["device"] = parameters[0].device.type
            facts["tf32"] = facts["tf32"] or uses_tf32(model, parameters[0].device)
        facts["shards_optimizer_state"] = facts["shards_optimizer_state"] or any(
            hasattr(p, "full_tensor") for p in parameters
        )
        named: list[tuple[str, torch.Tensor]] = []
        for name, parameter in model.named_parameters():
            while name.startswith(WRAPPER_PREFIXES):
                name = name.split(".", 1)[1]
            name = name.replace("._orig_mod.", ".").replace("._fsdp_wrapped_module.", ".")
            self.names.setdefault(id(parameter), name)
            named.append((name, parameter))
        return named

    def parameters(self, optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
        """An optimizer's parameters by name (those of no model seen: by group and position)."""
        return [
            (self.names.get(id(parameter), f"group{g}.param{i}"), parameter)
            for g, group in enumerate(optimizer.param_groups)
            for i, parameter in enumerate(group["params"])
        ]
