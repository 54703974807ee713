"""A user's script as every launched rank runs it: as ``__main__``, then the teardown rankwise's own
loop does.

``rankwise launch script.py`` starts ``python -m rankwise.launch.script script.py ARGS`` in each
rank.  The script runs exactly as ``python script.py ARGS`` would run it (``sys.argv``,
``sys.path[0]``, ``__name__ == "__main__"``); when it returns, a process group it left open is
closed the way :func:`rankwise.process.destroy_process_group` closes rankwise's own: its wrapped
modules collected, a barrier so no rank leaves while another still communicates, then the group
destroyed.  A script that returns with its group still open otherwise tears it down in the
interpreter's exit, where gloo aborts or hangs (measured: a stock Accelerate loop hung at exit in 5
of 6 two-rank runs).  A rank that still does not exit once its work is done is named and ended by
the exit guard (:mod:`rankwise.launch.exits`).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from rankwise import process
from rankwise.launch import exits
from rankwise.launch.failures import record_for_launcher
from rankwise.logs import to_terminal


def run_as_main(path: str | Path, args: list[str]) -> None:
    """Run ``path`` as ``python path ARGS`` would."""
    path = Path(path)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.resolve().parent))
    runpy.run_path(str(path), run_name="__main__")


def main(argv: list[str] | None = None) -> int | str | None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m rankwise.launch.script SCRIPT.py [ARGS]", file=sys.stderr)
        return 2
    # A rank of `rankwise launch`: rankwise's messages as the command prints them (the script can
    # change that).
    to_terminal()
    who = f"rank{os.environ.get('RANK', '0')}"
    exits.install(who)  # a rank that finished its work and does not exit is named and ended
    status: int | str | None = 0
    try:
        run_as_main(argv[0], argv[1:])
    except SystemExit as exiting:
        # `sys.exit(main())`: the same teardown as after a return, then its status
        status = exiting.code
    except Exception as error:
        if not record_for_launcher(error):
            raise
        # The launcher's summary prints it once, for the rank that failed first: no traceback from
        # every rank.
        process.destroy_process_group(clean=False)
        exits.script_returned(who, failed=True)
        return 1
    # (a failing status is a failed rank: its peers may never meet at a barrier)
    failed = status not in (0, None)
    process.destroy_process_group(clean=not failed)
    exits.script_returned(who, failed=failed)
    return status


if __name__ == "__main__":
    sys.exit(main())
