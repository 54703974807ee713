"""How processes start.  Strategies never start processes; launchers never know strategies.

One entry, torch's ``run.py`` shape: a :class:`LaunchConfig` and an :class:`Entry` reach the
launcher the configuration names, ``LAUNCHERS[config.launcher](config, entry)``.

* :mod:`rankwise.launch.torchrun` — torchrun's elastic agent, called in-process.
* :mod:`rankwise.launch.spawn` — ``torch.multiprocessing`` spawn (the ``mp.spawn`` style).
* :mod:`rankwise.launch.horovodrun` — ``horovodrun --gloo``, for Horovod's own controller.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rankwise.launch.config import LaunchConfig
    from rankwise.launch.entry import Entry
    from rankwise.launch.ports import free_port

# Every rank imports something from this package (its failure records, its script runner): the
# launchers and the validated configuration (pydantic) load on first use, so a rank does not pay for
# them when it starts.
_LAUNCHER_MODULES = ("torchrun", "spawn", "horovodrun")
"""Each launcher's module, named as ``launch.launcher`` names it (config.LAUNCHERS; a test keeps
them alike)."""
_EXPORTS = {"LaunchConfig": "config", "Entry": "entry", "free_port": "ports"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rankwise.launch.{_EXPORTS[name]}"), name)
    if name == "LAUNCHERS":
        return launchers()
    raise AttributeError(f"module 'rankwise.launch' has no attribute {name!r}")


def launchers() -> dict[str, Callable[[LaunchConfig, Entry], None]]:
    """Every way rankwise starts a job's workers, by ``launch.launcher`` name."""
    return {
        name: importlib.import_module(f"rankwise.launch.{name}").launch
        for name in _LAUNCHER_MODULES
    }


def launch(config: LaunchConfig, entry: Entry) -> None:
    """Start ``entry`` on this node's processes as ``config`` says and wait for them.

    Raises :class:`~rankwise.errors.LaunchError` naming the failed rank(s), or
    :class:`~rankwise.errors.Stopped` when a signal stopped the job.
    """
    importlib.import_module(f"rankwise.launch.{config.launcher}").launch(config, entry)


__all__ = ["LAUNCHERS", "Entry", "LaunchConfig", "free_port", "launch", "launchers"]
