"""How processes start.  Strategies never start processes; launchers never know strategies.

One entry, torch's ``run.py`` shape: a :class:`LaunchConfig` and an :class:`Entry` reach the
launcher the configuration names, ``LAUNCHERS[config.launcher](config, entry)``.

* :mod:`rankwise.launch.torchrun` — torchrun's elastic agent, called in-process.
* :mod:`rankwise.launch.spawn` — ``torch.multiprocessing`` spawn (the ``mp.spawn`` style).
* :mod:`rankwise.launch.horovodrun` — ``horovodrun --gloo``, for Horovod's own controller.
"""

from __future__ import annotations

from collections.abc import Callable

from rankwise.launch import horovodrun, spawn, torchrun
from rankwise.launch.config import LaunchConfig
from rankwise.launch.entry import Entry
from rankwise.launch.ports import free_port

LAUNCHERS: dict[str, Callable[[LaunchConfig, Entry], None]] = {
    "torchrun": torchrun.launch,
    "spawn": spawn.launch,
    "horovodrun": horovodrun.launch,
}
"""Every way rankwise starts a job's workers, by ``launch.launcher`` name."""


def launch(config: LaunchConfig, entry: Entry) -> None:
    """Start ``entry`` on this node's processes as ``config`` says and wait for them.

    Raises :class:`~rankwise.errors.LaunchError` naming the failed rank(s), or
    :class:`~rankwise.errors.Stopped` when a signal stopped the job.
    """
    LAUNCHERS[config.launcher](config, entry)


__all__ = ["LAUNCHERS", "Entry", "LaunchConfig", "free_port", "launch"]
