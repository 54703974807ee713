"""Python stacks as :mod:`faulthandler` writes them, read back.

faulthandler is how a process that is stuck says where: its C thread writes every thread's frames
while another thread holds the GIL, and needs nothing of the interpreter.  The stall deadline
(``rankwise verify``) and the exit guard (:mod:`rankwise.launch.exits`) both leave such a dump; this
reads one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

TIMEOUT = re.compile(r"^Timeout \((?P<time>[\d:.]+)\)!")
"""The line ``dump_traceback_later`` starts its dump with (a dump written on a signal has none)."""
_THREAD = re.compile(r"^(?:Current thread|Thread) (?P<thread>0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.+)$')


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{short(self.file)}:{self.line} in {self.function}"


HEADER = "rankwise {kind}: {who} main thread 0x{thread:016x} seconds {seconds:g}"
"""The line a deadline's dump file starts with, written when it is armed: what it is, whose
(``rank0``, ...), the main thread's id (faulthandler names threads by id) and the deadline."""
_HEADER = re.compile(
    r"^rankwise (?P<kind>[a-z ]+): (?P<who>\S+) main thread (?P<thread>0x[0-9a-f]+) "
    r"seconds (?P<seconds>[\d.]+)"
)


@dataclass
class Dump:
    """One process's dump: what wrote it and whose, its deadline, whether the deadline stopped it
    (else a signal wrote it), and each thread's frames, innermost first."""

    who: str
    seconds: float
    timed_out: bool
    main_thread: str | None
    threads: dict[str, list[Frame]] = field(default_factory=dict)
    kind: str = ""

    @property
    def main(self) -> list[Frame]:
        """The main thread's frames (innermost first); the last thread dumped where the main one is
        not known."""
        if self.main_thread in self.threads:
            return self.threads[self.main_thread]
        return next(reversed(self.threads.values()), [])


def parse_dump(text: str) -> Dump | None:
    """A dump file's text (:data:`HEADER`, then faulthandler's), or ``None`` where it holds no
    stack: the process ended without being stopped."""
    header = _HEADER.match(text)
    dump = Dump(who="?", seconds=0.0, timed_out=False, main_thread=None)
    if header:
        dump.who, dump.seconds, dump.main_thread, dump.kind = (
            header["who"],
            float(header["seconds"]),
            header["thread"],
            header["kind"],
        )
    dump.timed_out, dump.threads = parse_threads(text)
    return dump if dump.threads else None


def parse_threads(text: str) -> tuple[bool, dict[str, list[Frame]]]:
    """Whether a deadline wrote the dump (rather than a signal), and each thread's frames, innermost
    first."""
    timed_out, frames = False, None
    threads: dict[str, list[Frame]] = {}
    for line in text.splitlines():
        if TIMEOUT.match(line):
            timed_out = True
        elif match := _THREAD.match(line):
            frames = threads.setdefault(match["thread"], [])
        elif (match := _FRAME.match(line)) and frames is not None:
            frames.append(Frame(match["file"], int(match["line"]), match["function"].strip()))
    return timed_out, threads


def frame_in(frames: list[Frame], script: str | Path) -> Frame | None:
    """The innermost frame in ``script``."""
    name = str(Path(script).resolve())
    return next((frame for frame in frames if _same_file(frame.file, name)), None)


def _same_file(file: str, name: str) -> bool:
    try:
        return str(Path(file).resolve()) == name
    except OSError:
        return False


STDLIB = os.path.dirname(os.__file__)


def standard(file: str) -> bool:
    """Whether ``file`` is Python's own library."""
    return file.startswith(STDLIB) and "site-packages" not in file


def short(file: str) -> str:
    """A frame's file as a reader finds it: the script's name, or its path inside its package."""
    for marker in ("site-packages/", "/src/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return Path(file).name if not standard(file) else file.removeprefix(STDLIB + "/")
