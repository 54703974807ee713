"""One rank of a watched script: ``python -m rankwise.tools.watch.bootstrap SCRIPT.py [ARGS]``.

The launcher (torchrun, in ``rankwise verify`` and ``bench --script``) starts this module in every rank with
the watcher's settings in the environment; it installs the :class:`~rankwise.tools.watch.watcher.Watcher`
before the script imports anything, runs the script as ``__main__``
(:func:`rankwise.launch.script.run_as_main`), and after it (or after the watcher's last step) writes this
rank's record and closes the process group the script left open.  A rank that makes no progress for
``RANKWISE_WATCH_STALL`` seconds is stopped, with where it waited (:mod:`rankwise.tools.watch.stall`).  An
``mp.spawn`` script runs as one such process that starts its own ranks (:mod:`rankwise.tools.watch.spawned`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from rankwise import process
from rankwise.launch.failures import record_for_launcher
from rankwise.launch.script import run_as_main
from rankwise.logs import to_terminal
from rankwise.throughput import MIN_WINDOW_S
from rankwise.tools.watch import lightning, stall
from rankwise.tools.watch.watcher import WatchDone, Watcher

DIRECTORY, STEPS, WARMUP = "RANKWISE_WATCH", "RANKWISE_WATCH_STEPS", "RANKWISE_WATCH_WARMUP"
TRACE, DROPOUT = "RANKWISE_WATCH_TRACE", "RANKWISE_WATCH_DROPOUT"
FOLLOW, SCALE = "RANKWISE_WATCH_FOLLOW", "RANKWISE_WATCH_SCALE"
MIN_WINDOW, AFTER = "RANKWISE_WATCH_MIN_WINDOW", "RANKWISE_WATCH_AFTER"
STALL, SPAWN = "RANKWISE_WATCH_STALL", "RANKWISE_WATCH_SPAWN"
"""The watcher's settings, as the tools hand them to each rank."""


def watcher_from_environment() -> Watcher:
    steps = int(os.environ.get(STEPS, "20"))
    trace = os.environ.get(TRACE) == "1"
    return Watcher(os.environ[DIRECTORY], steps=steps, warmup=max(1, min(int(os.environ.get(WARMUP, "1")), steps - 1)),
                   follow=os.environ.get(FOLLOW) or None, scale=int(os.environ.get(SCALE, "1")),
                   keep_dropout=os.environ.get(DROPOUT) == "keep", trace=trace,
                   min_window_s=float(os.environ.get(MIN_WINDOW, MIN_WINDOW_S)),
                   after=os.environ.get(AFTER, "stop"))


def arm_stall(who: str) -> None:
    """This process's progress deadline (``who``: ``rank0``, ...), as the tool set it (0 or unset: none)."""
    stall.arm(float(os.environ.get(STALL) or 0), stall.dump_path(os.environ[DIRECTORY], who), who)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or DIRECTORY not in os.environ:
        print(f"usage: {DIRECTORY}=DIR python -m rankwise.tools.watch.bootstrap SCRIPT.py [ARGS]", file=sys.stderr)
        return 2
    to_terminal()  # a rank of `verify` or `bench --script`: rankwise's messages as under `rankwise launch`
    if os.environ.get(SPAWN):  # an mp.spawn script: this process starts the ranks, and each is watched there
        from rankwise.tools.watch.spawned import launcher_main
        return launcher_main(argv)
    arm_stall(f"rank{os.environ.get('RANK', '0')}")
    watcher = watcher_from_environment()
    watcher.install()
    if os.environ.get(lightning.ENVIRONMENT) == "1":
        lightning.launcher_devices()
        watcher.on_shorten.append(lightning.validate_at_each_pass_end)
    return watched(watcher, lambda: run_as_main(argv[0], argv[1:]))


def watched(watcher: Watcher, run: Callable[[], object], ended: Callable[[], None] = lambda: None) -> int:
    """Run the script (``run()``) under the installed ``watcher``; after it (or the watcher's last step), ``ended()``,
    this rank's record, and the process group closed.  1 where the script failed and the launcher has its error
    (else the error is raised)."""
    try:
        run()
    except WatchDone:
        pass  # the watcher's last step: the script's work here is done
    except Exception as error:
        if not record_for_launcher(error):
            raise
        # The launcher's summary prints it once, for the rank that failed first: no traceback from every rank.
        process.destroy_process_group(clean=False)
        stall.disarm()
        return 1
    else:
        watcher.script_returned = True
        if not watcher.trace and not watcher.reported and watcher.step >= watcher.steps:
            watcher.finish(script_ended=True)  # a benchmark's window, cut short by the script's own length
    ended()
    watcher.write_rank_record()
    process.destroy_process_group(clean=True)  # (under the deadline still: a barrier a peer never reaches stalls)
    stall.disarm()
    return 0


if __name__ == "__main__":
    sys.exit(main())
