"""One rank of a watched script: ``python -m rankwise.tools.watch.bootstrap SCRIPT.py [ARGS]``.

The launcher (torchrun, in ``rankwise verify`` and ``bench --script``) starts this module in every
rank with the watcher's settings in the environment; it installs the
:class:`~rankwise.tools.watch.watcher.Watcher` before the script imports anything, runs the script
as ``__main__`` (:func:`rankwise.launch.script.run_as_main`), and after it (or after the watcher's
last step) writes this rank's record and closes the process group the script left open.  A rank that
makes no progress for ``WatchSettings.stall_s`` seconds is stopped, with where it waited
(:mod:`rankwise.tools.watch.stall`).  An ``mp.spawn`` script runs as one such process that starts
its own ranks (:mod:`rankwise.tools.watch.spawned`).
"""

from __future__ import annotations

import os
import sys

from rankwise.launch import exits
from rankwise.launch.script import run_as_main
from rankwise.logs import to_terminal
from rankwise.tools.watch import deepspeed_engine, horovod_optimizer, lightning, workdir
from rankwise.tools.watch.settings import VARIABLE, WatchSettings
from rankwise.tools.watch.spawned import launcher_main
from rankwise.tools.watch.watched_rank import arm_stall, watched
from rankwise.tools.watch.watcher import Watcher


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or VARIABLE not in os.environ:
        print(
            f"usage: {VARIABLE}=SETTINGS.json python -m rankwise.tools.watch.bootstrap SCRIPT.py "
            "[ARGS] (SETTINGS: WatchSettings.to_environment())",
            file=sys.stderr,
        )
        return 2
    # a rank of `verify` or `bench --script`: rankwise's messages as under `rankwise launch`
    to_terminal()
    settings = WatchSettings.from_environment()
    # (the scratch mirrors the user's directory: a write through its links stays in the scratch)
    workdir.guard()
    # an mp.spawn script: this process starts the ranks, and each is watched there
    if settings.spawn:
        return launcher_main(argv, settings)
    if os.environ.get(horovod_optimizer.ENVIRONMENT) == "1":
        horovod_optimizer.ranks_from_horovodrun()
    who = f"rank{os.environ.get('RANK', '0')}"
    arm_stall(who, settings)
    exits.install(who, watch_gil=not settings.stall_s)  # (a stall deadline names one that keeps it)
    watcher = Watcher(settings)
    watcher.install()
    if os.environ.get(deepspeed_engine.ENVIRONMENT) == "1":
        deepspeed_engine.watch(watcher)
    if os.environ.get(horovod_optimizer.ENVIRONMENT) == "1":
        horovod_optimizer.watch(watcher)
    if os.environ.get(lightning.ENVIRONMENT) == "1":
        lightning.launcher_devices()
        watcher.on_shorten.append(lightning.validate_at_each_pass_end)
    status = watched(watcher, lambda: run_as_main(argv[0], argv[1:]))
    # the rank must be gone within the launcher's grace period
    exits.script_returned(who, failed=status != 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
