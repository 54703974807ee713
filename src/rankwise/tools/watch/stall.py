"""A progress deadline in every watched process: a rank that makes no progress for a bounded time is
stopped, and says where it waited.

:func:`arm` starts the deadline (``faulthandler.dump_traceback_later(seconds, exit=True)``): past
it, a C thread writes every thread's Python stack to the process's dump file, even while another
thread holds the GIL, then ends the process (``_exit(1)``), so its launcher stops the others. The
watcher calls :func:`progress` on each sign of progress (a model's forward, a batch, a backward, an
optimizer step); it pushes the deadline back at most every :data:`REARM_EVERY_S` (re-arming starts a
thread: a hot loop must not pay for it each time).  Progress is the run's, not the process's:
:func:`progress` also touches a heartbeat file in the run directory, and a watchdog thread in every
process pushes its deadline back while any process of the run made progress within it — a rank
waiting in a barrier while rank 0 evaluates alone is not stalled.  (A rank that holds the GIL while
it waits starves its watchdog thread: that is the hang the deadline is for.)  The first deadline
allows for start-up (imports, data preparation): at least :data:`START_UP_S`. A SIGTERM (the
launcher stopping the rest of a failed group) writes the stacks to the same file first, so a rank
stopped while it waited on the stalled one says where too.

:func:`read_dumps` reads a run directory's dump files back (:func:`parse_dump`: faulthandler's text)
and :func:`describe` says, per rank, where it waited: its innermost frame in the user's script and
its innermost frame overall.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from rankwise.launch.stacks import HEADER, Dump, Frame, frame_in, parse_dump, standard
from rankwise.tools.watch.ranks import outside_the_script

STALL_TIMEOUT_S = 120.0
"""``rankwise verify``'s default: seconds without progress before a rank is stopped."""
REARM_EVERY_S = 0.5
"""The least wall time between two re-armings: the deadline is met between ``seconds -
REARM_EVERY_S`` and ``seconds`` after the last progress."""
START_UP_S = 300.0
"""The least time a process has from :func:`arm` to the run's first progress."""
HEARTBEAT = "progress"
"""The run directory's file every process's :func:`progress` touches."""
DUMP = "stall-{who}-pid{pid}.txt"

_state: dict = {"file": None, "seconds": 0.0, "armed_at": 0.0, "heartbeat": None, "watchdog": None}


def dump_path(directory: str | Path, who: str) -> Path:
    """This process's dump file in ``directory``: ``who`` is ``rank0``, ``rank1``, ... or
    ``launcher``."""
    return Path(directory) / DUMP.format(who=who, pid=os.getpid())


def arm(seconds: float, path: str | Path, who: str = "") -> None:
    """Stop this process with every thread's stack in ``path`` after ``seconds`` without
    :func:`progress` (0: no deadline).  The file stays open for as long as the process runs:
    faulthandler writes to its descriptor."""
    disarm()
    if seconds <= 0:
        return
    handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 (kept open: the C thread writes to it)
    handle.write(
        HEADER.format(
            kind="stall deadline",
            who=who or Path(path).stem,
            thread=threading.main_thread().ident,
            seconds=seconds,
        )
        + "\n"
    )
    handle.flush()
    heartbeat = Path(path).parent / HEARTBEAT
    _state.update(file=handle, seconds=seconds, armed_at=time.monotonic(), heartbeat=heartbeat)
    faulthandler.dump_traceback_later(max(seconds, START_UP_S), exit=True, file=handle)
    stop = threading.Event()
    watchdog = threading.Thread(
        target=_watch_the_run,
        args=(handle, seconds, heartbeat, stop),
        daemon=True,
        name="rankwise-stall-watchdog",
    )
    _state["watchdog"] = stop
    watchdog.start()
    if threading.current_thread() is threading.main_thread():
        # A launcher stopping this rank (another one stalled or failed) first learns where it
        # waited.
        faulthandler.register(signal.SIGTERM, file=handle, all_threads=True, chain=True)


def progress() -> None:
    """The process moved on: push the deadline back (at most every :data:`REARM_EVERY_S`)."""
    if _state["file"] is None:
        return
    now = time.monotonic()
    if now - _state["armed_at"] < REARM_EVERY_S:
        return
    _state["armed_at"] = now
    faulthandler.dump_traceback_later(_state["seconds"], exit=True, file=_state["file"])
    with contextlib.suppress(OSError):
        _state["heartbeat"].touch()  # (the other processes' watchdogs read it)


def _watch_the_run(handle: TextIO, seconds: float, heartbeat: Path, stop: threading.Event) -> None:
    """While any process of the run made progress within ``seconds``, this process's deadline is
    pushed back to that much after it."""
    seen = 0.0
    while not stop.wait(min(1.0, seconds / 4)):
        if building():
            # (compiling is progress: the other ranks, waiting on this one's build, see it too)
            with contextlib.suppress(OSError):
                heartbeat.touch()
        try:
            last = heartbeat.stat().st_mtime
        except OSError:
            continue
        if last > seen:  # another process's progress (or this one's): the run moves
            seen = last
            left = seconds - (time.time() - last)
            if left > 0 and _state["file"] is handle:
                faulthandler.dump_traceback_later(left, exit=True, file=handle)


BUILDING, BATON = "torch/utils/cpp_extension.py", "torch/utils/file_baton.py"
"""Where a process builds a torch C++ extension (DeepSpeed compiles its ops, CPU Adam, on first
use: minutes on a machine without the build cached), and where one waits for another process's
build of it."""


def building() -> bool:
    """Whether the main thread is building a torch C++ extension.  Not while it waits on the
    build's lock: the process that builds shows the run's progress, and a lock no process holds any
    more (a build stopped half-way) would wait for ever."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    files = []
    while frame is not None:
        files.append(frame.f_code.co_filename.replace(os.sep, "/"))
        frame = frame.f_back
    return any(f.endswith(BUILDING) for f in files) and not any(f.endswith(BATON) for f in files)


def pause() -> None:
    """No deadline until the next :func:`arm` (this process now waits on others that have their
    own)."""
    if _state["file"] is not None:
        _state["watchdog"].set()  # (first: it could arm the deadline again)
        faulthandler.cancel_dump_traceback_later()


def disarm() -> None:
    """No deadline any more, and no stack on SIGTERM; the dump file is closed."""
    if _state["file"] is None:
        return
    _state["watchdog"].set()  # (first: it could arm the deadline again)
    faulthandler.cancel_dump_traceback_later()
    if threading.current_thread() is threading.main_thread():
        faulthandler.unregister(signal.SIGTERM)
    _state["file"].close()
    _state.update(file=None, seconds=0.0, watchdog=None)


# -- reading the dumps back ------------------------------------------------------------------------


def in_script(frames: list[Frame], script: str | Path | None = None) -> Frame | None:
    """The innermost frame in the user's script: ``script`` itself where given, else the innermost
    one outside torch, rankwise and Python's own library."""
    found = frame_in(frames, script) if script is not None else None
    if found is not None:
        return found
    return next(
        (
            frame
            for frame in frames
            if not outside_the_script(frame.file)
            and not standard(frame.file)
            and "site-packages" not in frame.file
        ),
        None,
    )


def read_dumps(directory: str | Path) -> list[Dump]:
    """Every process's dump in a run directory that holds a stack, ranks in order."""
    dumps = []
    for path in Path(directory).glob(DUMP.format(who="*", pid="*")):
        dump = parse_dump(path.read_text(encoding="utf-8", errors="replace"))
        if dump is not None:
            dumps.append(dump)
    return sorted(dumps, key=lambda dump: (not dump.timed_out, _order(dump.who)))


def describe(dumps: list[Dump], script: str | Path | None = None) -> str | None:
    """Where each stopped process waited, one line each, those its deadline stopped first; ``None``
    where no deadline fired (a stack a SIGTERM wrote alone says nothing of a stall)."""
    if not any(dump.timed_out for dump in dumps):
        return None
    lines = []
    for dump in dumps:
        who = (
            dump.who.replace("rank", "rank ")
            if dump.who.startswith("rank")
            else "the process that starts the ranks"
        )
        frames = dump.main
        ours, innermost = in_script(frames, script), frames[0] if frames else None
        where = f"at {ours}" if ours else "outside the script"
        if innermost is not None and innermost != ours:
            where += f" ({innermost})"
        if innermost is not None and innermost.file.replace(os.sep, "/").endswith(BATON):
            where += (
                ", on the lock of a torch C++ extension's build (DeepSpeed's ops): if no build "
                "is running, a stopped one left it; remove the `lock` file under "
                "~/.cache/torch_extensions (or $TORCH_EXTENSIONS_DIR)"
            )
        if dump.timed_out:
            lines.append(
                f"{who} made no progress for {dump.seconds:g} s and was stopped; it waited {where}"
            )
        else:
            lines.append(f"{who} was stopped by its launcher meanwhile; it waited {where}")
    return "\n".join(lines)


def _order(who: str) -> tuple[int, str]:
    number = who.removeprefix("rank")
    return (int(number), "") if number.isdigit() else (1 << 30, who)
