"""Every error rankwise raises for the user to act on, and the one exit code each command returns
for it.

Each message names what to fix: the config key, the file and line, the checkpoint, the rank.
The command line prints them without a traceback (:func:`exit_code` decides the code).
"""

from __future__ import annotations

import signal


class ConfigError(ValueError):
    """A configuration problem, phrased for the user (names the key or file)."""


class DataError(ValueError):
    """Bad input data; the message names the file and, where there is one, the line."""

    def __init__(self, path, message: str, line: int | None = None):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, found, verified or loaded (names its path)."""


class CollectiveSaveError(CheckpointError):
    """A library's own collective save (DeepSpeed's) failed on this rank half-way; the job cannot
    continue."""


class MissingProcessGroupError(RuntimeError):
    """A process launched as one of several (``WORLD_SIZE`` > 1) used a collective before joining
    the group."""


class LaunchError(RuntimeError):
    """One or more ranks failed; the message names each failed rank and its error, root cause
    first."""

    def __init__(self, failures: list[str], note: str = ""):
        self.failures = failures
        message = "worker(s) failed:\n" + "\n".join(f"  {line}" for line in failures)
        super().__init__(message + (f"\n  {note}" if note else ""))

    @classmethod
    def from_ranks(cls, failures: list, note: str = "") -> LaunchError:
        """From :class:`~rankwise.launch.failures.RankFailure` records: causes before victims,
        earliest first."""
        ordered = sorted(failures, key=lambda f: (f.victim, f.timestamp, f.rank))
        if not ordered:
            return cls([], note)
        first = ordered[0]
        # One mistake, one message: ranks that failed with the first one's error are named, not
        # repeated.
        same = [f for f in ordered[1:] if first.error and f.error == first.error]
        lines = [first.describe(first=True)]
        if same:
            ranks = ", ".join(str(f.rank) for f in same)
            lines.append(f"rank{'s' if len(same) > 1 else ''} {ranks} failed the same way")
        lines += [f.describe(first=False) for f in ordered[1:] if f not in same]
        return cls(lines, note)


class HungAtExit(LaunchError):
    """Every rank finished its work, and some did not exit: the exit guard named and ended them
    (:mod:`rankwise.launch.exits`).  The run completed; the exit status says so apart from a failed
    run."""

    exit_code = 3

    def __init__(self, failures: list):
        self.failures = [
            f"rank {f.rank} (host {f.host}, local rank {f.local_rank}, pid {f.pid}) {f.error}"
            for f in sorted(failures, key=lambda f: f.rank)
        ]
        RuntimeError.__init__(
            self,
            "the run's work finished, but not every rank exited:\n"
            + "\n".join(f"  {line}" for line in self.failures)
            + "\n  (exit status 3: completed, a rank hung at exit; --exit-grace sets how long a "
            "finished rank may take)",
        )


class MasterUnreachable(LaunchError):
    """This node could not reach the master's rendezvous port within the rendezvous timeout."""

    def __init__(self, message: str):
        self.failures = []
        RuntimeError.__init__(self, message)


class Stopped(RuntimeError):
    """The launcher was asked to stop (SIGTERM, SIGINT): the workers checkpointed and exited."""

    def __init__(self, signum: int, note: str = ""):
        """``note``: what the user can do next (e.g. resume from the checkpoint the workers
        wrote)."""
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name}" + (f"; {note}" if note else "")
        )


class ScriptNotRun(RuntimeError):
    """A tool could not run the user's script as it must (``rankwise plan``: up to its first
    training step with its model's parameters fake, then that step replayed); the message names the
    script's file and line and what failed there."""

    exit_code = 4


USAGE = 2
"""Bad input: configuration, data, checkpoint (nothing was started, or nothing was lost)."""
FAILED = 1
"""A run that started and failed (a rank raised, was killed or timed out)."""

COULD_NOT_RUN = ScriptNotRun.exit_code
"""A tool that could not run the user's script (``rankwise plan``; verify's and bench's "could not
run" use the same code)."""

USER_ERRORS = (ConfigError, DataError, CheckpointError, LaunchError, Stopped, ScriptNotRun)
"""What a command reports as one message instead of a traceback."""


def exit_code(error: BaseException) -> int:
    """The exit code of a command that ended with ``error``: 128 + signal when stopped by one."""
    if isinstance(error, (Stopped, HungAtExit, ScriptNotRun)):
        return error.exit_code
    if isinstance(error, LaunchError):
        return FAILED
    return USAGE
