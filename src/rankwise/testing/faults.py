"""Test-only fault injection: make one rank fail on purpose, to test what rankwise does about it.

Switched on only by the environment variable ``RANKWISE_TEST_FAULT``, which nothing in
rankwise sets and no user setting maps to::

    RANKWISE_TEST_FAULT="raise:rank=1:step=3"     rank 1 raises at the end of optimizer step 3
    RANKWISE_TEST_FAULT="kill:rank=1:step=5"      rank 1 SIGKILLs itself after step 5
    RANKWISE_TEST_FAULT="hang:rank=1:step=3"      rank 1 stops responding after step 3
    RANKWISE_TEST_FAULT="term:rank=0:step=3"      rank 0 sends SIGTERM to its launcher after step 3
    RANKWISE_TEST_FAULT="int:rank=0:step=3"       ... SIGINT (Ctrl-C)

A fault fires in the first attempt of a job only (``TORCHELASTIC_RESTART_COUNT`` 0), so a
restarted worker group runs clean; add ``:always`` to fire in every attempt.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from rankwise.process import restart_count

VARIABLE = "RANKWISE_TEST_FAULT"


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    always: bool = False

    @classmethod
    def parse(cls, text: str) -> Fault:
        kind, *fields = text.split(":")
        values = dict(field.split("=", 1) for field in fields if "=" in field)
        if (
            kind not in ("raise", "kill", "hang", "term", "int")
            or not {"rank", "step"} <= values.keys()
        ):
            raise ValueError(
                f"{VARIABLE}={text!r}: expected KIND:rank=R:step=S with KIND raise, kill, hang, "
                "term or int"
            )
        return cls(kind, int(values["rank"]), int(values["step"]), "always" in fields)


def configured() -> Fault | None:
    text = os.environ.get(VARIABLE)
    return Fault.parse(text) if text else None


def step_end_hooks() -> list:
    """The training loop's step-end hooks for the fault the environment asks for (none without
    one)."""
    fault = configured()
    return [lambda rank, step: at_step_end(fault, rank, step)] if fault else []


def at_step_end(fault: Fault | None, rank: int, step: int) -> None:
    """Called by the loop after each optimizer step with :func:`configured`'s fault (read once per
    run); does nothing unless a test asked for a fault here."""
    if fault is None or fault.rank != rank or fault.step != step:
        return
    if not fault.always and restart_count() > 0:
        return
    if fault.kind == "raise":
        raise RuntimeError(f"injected fault: rank {rank} fails at step {step}")
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind in ("term", "int"):
        # The launcher, as a scheduler preempting the job (SIGTERM) or a user's Ctrl-C (SIGINT)
        # would.
        os.kill(os.getppid(), signal.SIGTERM if fault.kind == "term" else signal.SIGINT)
        return
    # hang: alive, but never reaches the next collective.  SIGTERM's default action is restored so
    # that torchrun's SIGTERM ends this process at once (a rank stuck inside a C call waits for its
    # SIGKILL, 30 s later): tests need not wait for that.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        time.sleep(3600)
