"""``single``: one process, one device: the reference every other strategy is checked against."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from typing_extensions import override

from rankwise.strategies import register
from rankwise.strategies.base import Strategy
from rankwise.strategies.facts import BenchRow, Facts


@register
class SingleDevice(Strategy):
    name = "single"
    multiprocess = False
    description = "one process on one device (the reference run)"
    strategy_facts = Facts(
        layout="whole",  # no collective: the trace of one process is its memory
        bench="smoke",
        about="one process, all cores",
        bench_rows=(
            BenchRow("+compile", ("compile=true",), "one process with torch.compile", "opt-in"),
            BenchRow(
                "-1t",
                (),
                "one process, one thread: the base of DDP's scaling efficiency",
                "opt-in",
                threads=1,
            ),
        ),
    )

    @override
    def setup_environment(self) -> None:
        pass  # no process group: one process

    @override
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        return self.place(model), optimizer

    @override
    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    @override
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # nothing to synchronise

    @property
    @override
    def library_world_size(self) -> int:
        return 1
