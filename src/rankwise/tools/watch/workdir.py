"""Where a watched script runs: a copy of the user's working directory that the script may write.

A script reads paths relative to the directory it was started from (nanoGPT's ``configurator.py``
and ``data/<dataset>/train.bin``, minGPT's ``./data/input.txt`` through its hydra config) and
writes its outputs there (``out/ckpt.pt``, ``snapshot.pt``).  ``verify`` and ``bench --script`` run
it more than once, concurrently, stopped after a few steps: in the user's directory those runs
would overwrite the user's own checkpoints with a cut-short run's and race one another.  So each run
starts in its own scratch directory that mirrors the user's (:func:`mirror`):

* directories are made anew, so a file the script creates lands in the scratch;
* files up to :data:`COPY_BYTES` are copied, while the copies stay under :data:`COPY_BUDGET` in all;
* larger files (datasets) are linked, and a write to a linked file replaces the link with a file of
  its own first (:func:`guard`, installed in every rank): Python's ``open``/``os.open`` for
  writing, through an audit hook, and ``torch.save`` (whose C++ writer opens the file itself,
  :meth:`rankwise.tools.watch.saves.SaveWatch`).  A library writing in its own native code through
  such a link (safetensors' Rust writer) is not intercepted: the links are only the large files,
  which scripts read.

Hidden directories (``.git``, ``.venv``) and rankwise's own output tree are not mirrored.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from pathlib import Path

log = logging.getLogger(__name__)

COPY_BYTES = 1 << 20
"""Files up to this size are copied (configs, scripts, small texts); larger ones are linked."""
COPY_BUDGET = 64 << 20
"""The most bytes copied into one run's scratch: beyond it, every file is linked."""
MAX_ENTRIES = 20_000
"""The most files and directories mirrored: a working directory larger than this (a home
directory) is mirrored up to it, and the run says what was left out."""
ORIGIN = "RANKWISE_WATCH_ORIGIN"
"""The user's directory the scratch mirrors (set for the ranks: the guard replaces only links into
it)."""


def mirror(origin: Path, scratch: Path, leave_out: tuple[Path, ...] = ()) -> dict:
    """Mirror ``origin`` into ``scratch`` (which exists): returns ``{"copied": n, "linked": n,
    "left_out": n}``.  ``leave_out``: paths not mirrored (the run's own output tree).  A
    directory linked into ``origin`` is mirrored as the directory it links to."""
    origin, scratch = origin.resolve(), scratch.resolve()
    skip = {p.resolve() for p in leave_out} | {scratch}
    counts = {"copied": 0, "linked": 0, "left_out": 0}
    budget, entries = COPY_BUDGET, 0
    pending = [(origin, scratch)]
    while pending:
        source, target = pending.pop()
        try:
            children = sorted(os.scandir(source), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in children:
            path = Path(entry.path)
            if path in skip:
                continue
            if entries >= MAX_ENTRIES:
                counts["left_out"] += 1
                continue
            entries += 1
            destination = target / entry.name
            try:
                if entry.is_dir(follow_symlinks=True):
                    if not entry.name.startswith("."):
                        destination.mkdir(exist_ok=True)
                        pending.append((path, destination))
                elif entry.is_file(follow_symlinks=True):
                    size = entry.stat(follow_symlinks=True).st_size
                    if size <= COPY_BYTES and size <= budget:
                        shutil.copy2(path, destination)
                        budget -= size
                        counts["copied"] += 1
                    else:
                        destination.symlink_to(path.resolve())
                        counts["linked"] += 1
            except OSError as error:  # (unreadable, a socket, a race with a writer)
                log.debug("not mirrored: %s (%s)", path, error)
    if counts["left_out"]:
        log.warning(
            "rankwise: the working directory %s holds more than %d files and directories: the "
            "script's run sees the first %d of them (%d left out); run from the script's own "
            "directory",
            origin,
            MAX_ENTRIES,
            MAX_ENTRIES,
            counts["left_out"],
        )
    return counts


_WRITE = os.O_WRONLY | os.O_RDWR
_busy = threading.local()


def unlink_before_write(path: object, truncates: bool = True) -> None:
    """If ``path`` is a link the mirror made into the user's directory, replace it with a file of
    the scratch's own: empty when the write truncates, a copy of the linked file otherwise."""
    origin = os.environ.get(ORIGIN)
    if not origin or getattr(_busy, "on", False) or not isinstance(path, str | os.PathLike):
        return
    try:
        if not os.path.islink(path):
            return
        target = os.path.realpath(path)
        if not target.startswith(origin.rstrip(os.sep) + os.sep):
            return
        _busy.on = True
        os.unlink(path)
        if not truncates:
            shutil.copy2(target, path)
    except OSError:
        return
    finally:
        _busy.on = False


def _audit(event: str, args: tuple) -> None:
    if event == "open" and len(args) == 3:
        path, _, flags = args
        if isinstance(flags, int) and flags & _WRITE:
            unlink_before_write(path, truncates=bool(flags & os.O_TRUNC))


def guard() -> None:
    """In a rank: writes through the mirror's links never reach the user's files (Python's opens
    for writing; ``torch.save`` calls :func:`unlink_before_write` itself)."""
    if os.environ.get(ORIGIN):
        sys.addaudithook(_audit)
