"""The exit guard: a rank that has finished its work and does not exit is named, with where it
waits, and ended.

Why a finished rank can hang: gloo runs each collective on a worker thread of its
``ProcessGroupGloo``, and that thread drops its reference to the collective's work object after it
completes.  When that is the last reference, freeing the work frees tensors that Python owns too,
which needs the GIL.  The group itself is freed with its last user, often not at
``destroy_process_group()`` (which only forgets it) but when the script's DDP model goes (its
``Reducer`` holds the group), as ``main()`` returns: the destructor joins the worker threads while
the main thread holds the GIL.  If a worker is still waiting for the GIL then, neither moves again,
silently (measured by an issue reporter: 4 of 10 runs of Accelerate's quick tour, whose last
collective is ``gather_for_metrics``).

rankwise avoids it where it can: when the script destroys its group, the group is kept
(:func:`install`) until the script's objects are gone, then freed through its Python wrapper, whose
destructor lets go of the GIL (:func:`release_groups`); and the main thread lets go of the GIL for a
moment first (:func:`settle`), so a worker still finishing its last collective's work can (else a
group something keeps until the interpreter's exit aborts there: "terminate called without an active
exception").  Where it cannot, a bounded grace period (``--exit-grace``, :data:`EXIT_GRACE_S` by
default) ends the rank:

* after the script destroyed its default group, a rank whose main thread keeps the GIL for the grace
  period is hung (a thread of this module re-arms a ``faulthandler`` deadline within every quarter
  of it; holding the GIL starves that thread);
* after the script returned (and rankwise closed a group it left open), a rank still running after
  the grace period is hung, whatever it waits for (an interpreter-exit hook, a thread that never
  ends).

Either way ``faulthandler``'s C thread, which needs no GIL, writes every thread's stack to
``exit-rankN-pidP.txt`` in :data:`DIRECTORY` and ends the rank (exit status 1); the launcher reads
the file back (:func:`read_dumps`) and reports "finished its work, hung at exit, ended after N s",
with the exit status :data:`HUNG_AT_EXIT` when that is all that went wrong.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import os
import re
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rankwise.errors import HungAtExit
from rankwise.launch.failures import in_user_code
from rankwise.launch.stacks import HEADER, Dump, parse_dump

EXIT_GRACE_S = 30.0
"""The default grace period: how long a rank that finished its work may take to exit (or keep the
GIL)."""
GRACE = "RANKWISE_EXIT_GRACE_S"
"""Environment: the grace period in seconds the launcher gives its ranks (0: no guard)."""
DIRECTORY = "RANKWISE_EXIT_DIR"
"""Environment: where the ranks write their dump files (the launcher's; no guard without it)."""
HUNG_AT_EXIT = HungAtExit.exit_code
"""``rankwise launch``'s exit status when every rank finished its work and some hung at exit and
were ended: the run completed (0 would hide the hang; 1 is a failed run)."""
DUMP = "exit-{who}-pid{pid}.txt"
_FILE = re.compile(r"exit-rank(?P<rank>\d+)-pid(?P<pid>\d+)\.txt")
KIND = "exit guard"
SETTLE_S = 0.05
"""How long :func:`settle` lets go of the GIL: gloo's worker threads free a completed collective's
work in far less."""
REARM_EVERY_S = 1.0

_SINCE = "rankwise exit guard: the script "
RETURNED, FAILED, DESTROYED = "returned", "failed", "destroyed its process group"
"""What the script had done when a rank's guard armed: only a script that returned or destroyed its
group had finished its work."""
_THREAD = "rankwise exit guard: a thread the exit waits for: "
_state: dict = {"file": None, "stop": None}
_kept: list = []
"""The process groups the script destroyed, until :func:`release_groups`."""


def grace_s() -> float:
    """The grace period this rank's launcher gave it (``0``: no guard)."""
    directory = os.environ.get(DIRECTORY)
    if not directory:
        return 0.0
    value = os.environ.get(GRACE)
    return float(value) if value else EXIT_GRACE_S


def settle() -> None:
    """Let go of the GIL for a moment, so that a gloo worker still freeing its last collective's
    work finishes before anything joins it."""
    time.sleep(SETTLE_S)


def install(who: str, watch_gil: bool = True) -> None:
    """Guard this rank (``who``: ``rank0``, ...): when its script destroys the default process
    group, :func:`settle` first, then (``watch_gil``) the GIL watch (:func:`work_done`; a tool's own
    stall deadline may stand for it)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group
    if getattr(original, "__rankwise_exit_guard__", False):
        return

    @functools.wraps(original)
    def destroy_process_group(group=None):
        default = group is None or group is c10d.GroupMember.WORLD
        # Why: the groups must not be freed by their last DDP user (its Reducer frees them holding
        # the GIL) but by release_groups(), whose Python wrapper frees them without it; and a worker
        # still freeing the last collective's work needs the GIL a moment before the group goes.
        _kept.extend(list(getattr(c10d._world, "pg_map", ())) if default else [group])
        if default:
            settle()
        original(group)
        if default and watch_gil:
            work_done(who, DESTROYED)

    # a marker on the wrapper (install() is idempotent by it); functions take attributes, their type
    # does not say
    destroy_process_group.__rankwise_exit_guard__ = True  # type: ignore[attr-defined]
    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group


def work_done(who: str, what: str) -> None:
    """The script ``what`` (destroyed its process group): from now on, a main thread that keeps the
    GIL for the grace period is hung."""
    if _state["stop"] is not None or not _open(who, what):
        return
    stop = threading.Event()
    _state["stop"] = stop
    handle, seconds = _state["file"], grace_s()

    def rearm() -> None:  # (starved of the GIL, it re-arms nothing: the deadline then fires)
        while not stop.wait(min(REARM_EVERY_S, seconds / 4)):
            faulthandler.dump_traceback_later(seconds, exit=True, file=handle)

    faulthandler.dump_traceback_later(seconds, exit=True, file=handle)
    threading.Thread(target=rearm, daemon=True, name="rankwise-exit-guard").start()


def script_returned(who: str, failed: bool = False) -> None:
    """The script returned (``failed``: raised, or exited with a failing status) and rankwise closed
    what it left open: this rank must be gone within the grace period; the groups the script
    destroyed are freed now (:func:`release_groups`)."""
    if _state["stop"] is not None:
        _state["stop"].set()
        _state["stop"] = None
    if _open(who, FAILED if failed else RETURNED):
        try:
            # the interpreter's exit waits for these: name them
            for thread in threading.enumerate():
                if (
                    not thread.daemon
                    and thread is not threading.current_thread()
                    and thread.ident is not None
                ):
                    _state["file"].write(f"{_THREAD}{thread.ident:#018x} {thread.name}\n")
            _state["file"].flush()
        except (OSError, ValueError):
            pass  # (the names are a help: the deadline below is what matters)
        faulthandler.dump_traceback_later(grace_s(), exit=True, file=_state["file"])
    # (under the deadline: joining a worker that waits for a peer's late collective can hang)
    release_groups()


def release_groups() -> None:
    """Free the process groups the script destroyed, once its own objects are gone (its DDP models
    with their Reducers): the last owner is then this module's reference to each group's Python
    wrapper, whose destructor lets go of the GIL while it joins gloo's worker threads."""
    gc.collect()  # (the script's globals sit in a reference cycle with its functions)
    _kept.clear()
    gc.collect()


def _open(who: str, what: str) -> bool:
    """The dump file, once per process, with a line saying what the script had done; ``False`` where
    there is no guard (or no file to write: the guard never turns a finished rank into a failed
    one)."""
    seconds = grace_s()
    if seconds <= 0:
        return False
    # (faulthandler ends the rank with _exit: buffered output would be lost)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        if _state["file"] is None:
            path = Path(os.environ[DIRECTORY]) / DUMP.format(who=who, pid=os.getpid())
            handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 (kept open: faulthandler writes to it)
            handle.write(
                HEADER.format(
                    kind=KIND, who=who, thread=threading.main_thread().ident, seconds=seconds
                )
                + "\n"
            )
            _state["file"] = handle
        _state["file"].write(f"{_SINCE}{what}\n")
        _state["file"].flush()
    except (OSError, ValueError):
        return False
    if threading.current_thread() is threading.main_thread():
        # A rank its launcher stops meanwhile (another one was ended) says where it was too.
        with contextlib.suppress(ValueError, RuntimeError):
            faulthandler.register(signal.SIGTERM, file=_state["file"], all_threads=True, chain=True)
    return True


# -- the launcher's side ---------------------------------------------------------------------------


@contextlib.contextmanager
def dump_directory():
    """A directory for this launcher's ranks' dump files while the block runs (the workers inherit
    :data:`DIRECTORY`), removed after it."""
    previous = os.environ.get(DIRECTORY)
    with tempfile.TemporaryDirectory(prefix="rankwise-exit-") as directory:
        os.environ[DIRECTORY] = directory
        try:
            yield Path(directory)
        finally:
            if previous is None:
                os.environ.pop(DIRECTORY, None)
            else:
                os.environ[DIRECTORY] = previous


@dataclass(frozen=True)
class HungRank:
    """What a rank's guard left: its dump (a deadline's, or the launcher's SIGTERM's), and what its
    script had done (:data:`RETURNED`, :data:`DESTROYED` or :data:`FAILED`)."""

    rank: int
    dump: Dump
    since: str
    threads: dict[str, str]
    """The threads the interpreter's exit waited for: id (as faulthandler writes it) -> name."""

    @property
    def finished(self) -> bool:
        """Known to have finished its work: ended by its own deadline after its work, or stopped by
        the launcher after its script returned (one stopped after destroying its group may still
        have been working)."""
        return self.since == RETURNED or (self.since == DESTROYED and self.dump.timed_out)

    def describe(self) -> str:
        """What happened to the rank and where it waited (its innermost frame in the script, and the
        innermost of all)."""
        where = _where(self.dump.main)
        for ident, name in self.threads.items():
            frames = self.dump.threads.get(ident)
            if frames:
                where += f"; for thread {name!r}, which waited {_where(frames)}"
        if not self.dump.timed_out:
            done = (
                "finished its work"
                if self.since == RETURNED
                else "had destroyed its process group (it may still have been working)"
            )
            return (
                f"{done}, and was stopped by the launcher when another rank was ended; it was "
                f"{where}"
            )
        done = "failed, then" if self.since == FAILED else "finished its work,"
        return (
            f"{done} hung at exit (after the script {self.since}), ended after "
            f"{self.dump.seconds:g} s; it waited {where}"
        )


def read_dumps(directory: str | Path) -> dict[int, HungRank]:
    """What the guard left in ``directory`` where a rank was ended (by its deadline, or by the
    launcher after its work was done): pid -> what it left.  Keyed by pid: a restarted group's ranks
    are other processes."""
    ended = {}
    for path in Path(directory).glob(DUMP.format(who="rank*", pid="*")):
        named = _FILE.fullmatch(path.name)
        text = path.read_text(encoding="utf-8", errors="replace")
        dump = parse_dump(text)
        if named is None or dump is None or dump.kind != KIND:
            continue
        lines = text.splitlines()
        since = [line.removeprefix(_SINCE) for line in lines if line.startswith(_SINCE)]
        threads = dict(
            line.removeprefix(_THREAD).split(" ", 1) for line in lines if line.startswith(_THREAD)
        )
        hung = HungRank(int(named["rank"]), dump, since[-1] if since else RETURNED, threads)
        if dump.timed_out or hung.since != FAILED:
            ended[int(named["pid"])] = hung
    return ended


def completed(failed_pids: list[int], ended: dict[int, HungRank]) -> bool:
    """Whether every failed rank (by pid) had finished its work: the run completed, some ranks hung
    at exit."""
    return bool(failed_pids) and all(pid in ended and ended[pid].finished for pid in failed_pids)


def _where(frames: list) -> str:
    """ "at script.py:12 in main (innermost: ...)": the innermost frame in the script, and the
    innermost of all."""
    script = next((frame for frame in frames if in_user_code(frame.file)), None)
    where = f"at {script}" if script else "outside the script"
    if frames and frames[0] != script:
        where += f" (innermost: {frames[0]})"
    return where
