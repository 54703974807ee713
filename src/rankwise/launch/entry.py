"""What every worker of a launched job runs."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """A module every worker runs: ``python -m MODULE ARGS...`` under torchrun and horovodrun, its
    ``main(args)`` in each spawned process under spawn."""

    module: str
    args: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The worker's command line after the interpreter."""
        return ["-m", self.module, *self.args]

    def run(self) -> None:
        """Run the module's ``main`` in this process (what a spawned worker does)."""
        importlib.import_module(self.module).main(list(self.args))
