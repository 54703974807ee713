"""rankwise's messages, through :mod:`logging`: the ``rankwise`` logger and one child per module.

A program that uses rankwise as a library controls them as it would any library's:

```python
import logging
logging.getLogger("rankwise").setLevel(logging.WARNING)                   # only warnings and errors
logging.getLogger("rankwise").addHandler(logging.FileHandler("rank.log"))  # or keep them
```

rankwise installs no handler of its own: without one, Python shows warnings and errors on stderr
(the bare text, its ``lastResort``) and drops the rest.  The ``rankwise`` commands, and the workers
they start, call :func:`to_terminal`, which prints each message as the commands always have: the
text alone, on stdout, or on stderr for warnings and for notes about the run (``stderr=True``) that
are not the command's output.

Rank-aware: a message is emitted by rank 0 only, unless its call says ``every_rank=True``; a process
that is not (yet) a rank -- the launching process -- counts as rank 0.
"""

from __future__ import annotations

import logging
import os
import sys

import torch.distributed as torch_dist

ROOT = "rankwise"
"""The logger every rankwise logger is a child of."""


def this_rank() -> int:
    """This process's global rank: the process group's, else the launcher's variables (torchrun,
    horovodrun), else 0."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank()
    for variable in ("RANK", "HOROVOD_RANK"):
        if variable in os.environ:
            return int(os.environ[variable])
    return 0


class RankLogger(logging.LoggerAdapter):
    """A module's logger that speaks on rank 0 only unless ``every_rank=True``; ``stderr=True``
    marks a note the commands print on stderr (warnings and errors go there anyway)."""

    # ignore[override]: two keyword-only flags added (LoggerAdapter's **kwargs is typed object);
    # every other keyword passes on to Logger.log unchanged
    def log(  # type: ignore[override]
        self,
        level,
        msg,
        *args,
        every_rank: bool = False,
        stderr: bool = False,
        **kwargs,
    ) -> None:
        if not self.isEnabledFor(level) or not (every_rank or this_rank() == 0):
            return
        if stderr:
            kwargs["extra"] = {**kwargs.get("extra", {}), "stderr": True}
        kwargs.setdefault("stacklevel", 2)  # the caller's file and line, not this adapter's
        self.logger.log(level, msg, *args, **kwargs)


def get_logger(name: str) -> RankLogger:
    """The rank-aware logger of module ``name`` (pass ``__name__``: ``rankwise.<module>``)."""
    if name != ROOT and not name.startswith(ROOT + "."):
        raise ValueError(
            f"{name!r} is not a rankwise module: its messages would escape "
            f"logging.getLogger({ROOT!r})"
        )
    return RankLogger(logging.getLogger(name))


class Terminal(logging.Handler):
    """Each message's text on its own line, flushed: on stderr for warnings, errors and
    ``stderr=True`` notes, else on stdout.  The streams are looked up at each message, so a
    redirected ``sys.stdout`` is honoured."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            to_stderr = record.levelno >= logging.WARNING or getattr(record, "stderr", False)
            stream = sys.stderr if to_stderr else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own convention: report, never raise into the caller
            self.handleError(record)


def to_terminal(level: int = logging.INFO) -> None:
    """What a ``rankwise`` command (or a worker it started) does first: print rankwise's messages at
    ``level`` and above as the commands always have.  The terminal is theirs: the messages do not
    also reach handlers the program gave the root logger.  Calling it again changes nothing."""
    logger = logging.getLogger(ROOT)
    if not any(isinstance(handler, Terminal) for handler in logger.handlers):
        logger.addHandler(Terminal())
    logger.setLevel(level)
    logger.propagate = False
