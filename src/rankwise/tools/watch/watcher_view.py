"""The watcher as the modules it drives see it: a protocol that
:class:`~rankwise.tools.watch.watcher.Watcher` meets, for the modules the watcher imports (its
rank record, :mod:`~rankwise.tools.watch.seen`; the frameworks' adapters it reaches through them)
and those that drive it (a Runtime's steps): their annotations name the watcher without an import
cycle (``tests/test_layers.py`` counts the imports made only for type checking too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from rankwise.tools.watch.calls import CallWatch
from rankwise.tools.watch.loaders import LoaderWatch
from rankwise.tools.watch.lockstep import Lockstep
from rankwise.tools.watch.saves import SaveWatch
from rankwise.tools.watch.step_watch import StepWatch
from rankwise.tools.watch.window import ReportedWatcher


class WatcherView(ReportedWatcher, Protocol):
    """A rank's :class:`~rankwise.tools.watch.watcher.Watcher`: its parts, and what it is told."""

    step_watch: StepWatch
    calls: CallWatch
    data: LoaderWatch
    saves: SaveWatch
    lockstep: Lockstep
    ended_by: str

    @property
    def tracing(self) -> bool: ...

    def model_seen(self, model: nn.Module) -> None: ...

    def step_begins(self, optimizer: object, no_grad: list[str]) -> None: ...

    def exchange(self, gradients: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None: ...

    def step_ends(
        self,
        parameters: list[torch.Tensor],
        weights: Callable[[], dict[str, torch.Tensor]],
        follow: Callable[[dict[str, torch.Tensor]], None],
    ) -> None: ...

    def finish(self, script_ended: bool = False) -> None: ...

    def _before_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None: ...

    def _after_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None: ...
