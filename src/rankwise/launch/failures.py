"""Failures of launched workers, summarised the same way by every launcher.

The summary puts the root cause first: the rank that failed earliest, preferring a rank
that raised or was killed over one that only lost its connection to it (a victim).
"""

from __future__ import annotations

import os
import re
import socket
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TRACEBACK_LINES = 8
"""Lines of the failing rank's traceback the summary repeats."""

USER_ERRORS = ("ConfigError", "DataError", "CheckpointError")
"""Errors whose sentence says what to change: the summary shows where the script made the call, not
a traceback."""

LIBRARY_DIRS = tuple(
    str(Path(p).resolve())
    for p in {
        sysconfig.get_path("purelib"),
        sysconfig.get_path("stdlib"),
        sysconfig.get_path("platlib"),
    }
    if p
)
RANKWISE_DIR = str(Path(__file__).resolve().parents[1])
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in .*$')

# A rank whose error says only that a peer went away is a victim, not the cause.
VICTIM_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Socket Timeout",
    "Timed out waiting",
    "ECONNRESET",
    "terminated by the launcher",
)


@dataclass
class RankFailure:
    rank: int
    local_rank: int
    pid: int
    how: str
    """``exit code N`` or ``signal SIGKILL``."""
    error: str = ""
    """The exception's last line (or what is known)."""
    traceback: str = ""
    host: str = ""
    timestamp: float = 0.0

    @property
    def victim(self) -> bool:
        return any(sign in self.error or sign in self.traceback for sign in VICTIM_SIGNS)

    def describe(self, first: bool) -> str:
        role = "failed first" if first else "also failed"
        line = (
            f"rank {self.rank} (host {self.host or socket.gethostname()}, local rank "
            f"{self.local_rank}, "
            f"pid {self.pid}) {role}, with {self.how}" + (f": {self.error}" if self.error else "")
        )
        if not first:
            return line
        where = script_frame(self.traceback)
        if where and self.error.split(":", 1)[0] in USER_ERRORS:
            return line + f"\n    where: {where}"  # the sentence says what to change; this, where
        tail = [t for t in self.traceback.strip().splitlines() if t.strip()][-TRACEBACK_LINES:]
        if tail:
            line += "\n    last traceback lines:\n" + "\n".join(f"      {t}" for t in tail)
        if where and not any(where.split(":", 1)[0] in t.replace('"', "") for t in tail):
            line += f"\n    in your code: {where}"
        return line


def in_user_code(file: str) -> bool:
    """Whether a frame's file is the user's own code: not Python's, a library's, rankwise's, nor
    ``<string>``."""
    if file.startswith("<"):
        return False
    path = str(Path(file).resolve())
    return not (path.startswith(LIBRARY_DIRS) or path.startswith(RANKWISE_DIR))


def script_frame(traceback: str) -> str | None:
    """The innermost frame of ``traceback`` in the user's own code (not Python's, a library's or
    rankwise's), as ``FILE, line N: CODE``."""
    lines = traceback.splitlines()
    found = None
    for i, text in enumerate(lines):
        match = _FRAME.match(text)
        if not match:
            continue
        if not in_user_code(match["file"]):
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
        found = f"{match['file']}, line {match['line']}" + (f": {code}" if code else "")
    return found


def record_for_launcher(error: BaseException) -> bool:
    """In a rank torchrun started: write ``error`` where the launcher's summary reads it (unless the
    Runtime already did), so the rank can exit without printing a traceback every rank repeats.
    ``False`` elsewhere."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    if not Path(path).exists():
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        try:
            ErrorHandler().record_exception(error)
        except OSError:
            return False  # the summary would lack it: let the traceback print
    return True
