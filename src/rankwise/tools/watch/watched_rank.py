"""One watched rank: its watcher and stall deadline (on the settings the tool handed it whole,
:mod:`rankwise.tools.watch.settings`), the script run under them and the teardown after it.

Shared by the two ways a watched rank starts: :mod:`rankwise.tools.watch.bootstrap` (a rank torchrun
started) and :mod:`rankwise.tools.watch.spawned` (a rank an ``mp.spawn`` script started itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from rankwise import process
from rankwise.launch.failures import record_for_launcher
from rankwise.tools.watch import stall
from rankwise.tools.watch.settings import WatchSettings
from rankwise.tools.watch.watcher import WatchDone, Watcher


def arm_stall(who: str, settings: WatchSettings) -> None:
    """This process's progress deadline (``who``: ``rank0``, ...), as the tool set it (0: none)."""
    stall.arm(settings.stall_s, stall.dump_path(settings.directory, who), who)


def watched(
    watcher: Watcher, run: Callable[[], object], ended: Callable[[], None] = lambda: None
) -> int:
    """Run the script (``run()``) under the installed ``watcher``; after it (or the watcher's last
    step), ``ended()``, this rank's record, and the process group closed.  1 where the script failed
    and the launcher has its error (else the error is raised)."""
    try:
        try:
            run()
        except WatchDone:
            raise  # (a SystemExit too: the watcher's own)
        except SystemExit as exiting:
            # `sys.exit(main())`: a failing status is the script's failure
            if exiting.code not in (0, None):
                raise RuntimeError(f"the script exited with status {exiting.code}") from None
    except WatchDone:
        pass  # the watcher's last step: the script's work here is done
    except Exception as error:
        stop_profiling(watcher)
        if not record_for_launcher(error):
            raise
        watcher.ended_by = "failure"
        # what ran before the failure still counts for the findings
        with contextlib.suppress(Exception):
            watcher.write_rank_record()
        # The launcher's summary prints it once, for the rank that failed first: no traceback from
        # every rank.
        process.destroy_process_group(clean=False)
        stall.disarm()
        return 1
    else:
        watcher.ended_by = "script"
        stop_profiling(watcher)
        if (
            not watcher.settings.trace
            and not watcher.window.reported
            and watcher.step >= watcher.settings.watched_steps
        ):
            # a benchmark's window, cut short by the script's own length
            watcher.finish(script_ended=True)
    ended()
    watcher.write_rank_record()
    # (under the deadline still: a barrier a peer never reaches stalls)
    process.destroy_process_group(clean=True)
    stall.disarm()
    return 0


def stop_profiling(watcher: Watcher) -> None:
    """A script that ended during its profiled steps leaves no profiler running (torch's crashes the
    process at exit, SIGSEGV, where one is left on)."""
    if watcher.window.profile is not None:
        with contextlib.suppress(Exception):
            watcher.window.profile.stop()
