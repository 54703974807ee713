"""Failures of launched workers, summarised the same way by every launcher.

The summary puts the root cause first: the rank that failed earliest, preferring a rank
that raised or was killed over one that only lost its connection to it (a victim).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

TRACEBACK_LINES = 8
"""Lines of the failing rank's traceback the summary repeats."""

# A rank whose error says only that a peer went away is a victim, not the cause.
VICTIM_SIGNS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket Timeout",
                "Timed out waiting", "ECONNRESET", "terminated by the launcher")


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
        line = (f"rank {self.rank} (host {self.host or socket.gethostname()}, local rank {self.local_rank}, "
                f"pid {self.pid}) {role}, with {self.how}" + (f": {self.error}" if self.error else ""))
        tail = [t for t in self.traceback.strip().splitlines() if t.strip()][-TRACEBACK_LINES:]
        if first and tail:
            line += "\n    last traceback lines:\n" + "\n".join(f"      {t}" for t in tail)
        return line
