"""``RANKWISE_SMOKE=1``: every command at a smoke size, for the documentation tests.

The documentation tier (``make test-docs``) runs every command the README and ``docs/`` show,
exactly as written; this variable, read where the command line is read, caps what each command
does so that the whole tier fits CI:

* ``train``: at most :data:`TRAIN_STEPS` optimizer steps (evaluation and the checkpoint as usual);
* ``bench``: the built-in task at the ``smoke`` preset (its four rows unless ``--strategies`` names
  others), one repeat; ``--script``: :data:`SCRIPT_STEPS` timed steps with no least window, one
  repeat, :data:`VERIFY_STEPS`-step equivalence checks;
* ``verify``: :data:`VERIFY_STEPS` compared steps;
* ``comm bench``: messages up to :data:`COMM_MAX_BYTES`, :data:`COMM_ITERS` timed calls per size.

Every check still runs; only sizes shrink, and each command says on stderr what it capped.  The
variable is taken out of the environment when it is read: the processes a command starts (a bench
row's ``rankwise train``, a verify run) run at the size the command chose for them.
"""

from __future__ import annotations

import os

from rankwise.logs import get_logger

VARIABLE = "RANKWISE_SMOKE"
TRAIN_STEPS = 4
"""``rankwise train``: optimizer steps at most."""
SCRIPT_STEPS = 3
"""``rankwise bench --script``: timed optimizer steps of each row at most."""
VERIFY_STEPS = 2
"""``rankwise verify`` and bench's equivalence checks of a script: compared steps at most."""
COMM_MAX_BYTES = 1 << 20
"""``rankwise comm bench``: the largest message."""
COMM_ITERS = 3
"""``rankwise comm bench``: timed calls per size at most (and one untimed call before them)."""

log = get_logger(__name__)
_on = False


def take() -> None:
    """Read the variable once, for this command, and remove it from the environment (see the
    module docstring)."""
    global _on
    _on = os.environ.pop(VARIABLE, "").strip().lower() in ("1", "true", "yes")


def on() -> bool:
    """Whether this command runs at a smoke size."""
    return _on


def cap(value: int | None, limit: int) -> int:
    """``value`` kept under ``limit`` (no value: ``limit``)."""
    return limit if value is None else min(value, limit)


def say(command: str, what: str) -> None:
    """Tell the user what the smoke size changed (stderr: the command's output stays its own)."""
    log.info(f"rankwise {command}: {VARIABLE}=1: {what}", stderr=True)
