"""The documentation tier: every shell block of README.md and docs/ runs as written (``make
test-docs``).

pytest-codeblocks (pinned in the ``dev`` extra) collects the ```` ```bash ```` and ```` ```python
```` blocks of the pages given to ``pytest --codeblocks`` and reads the markers written as an HTML
comment on the line above a block (``<!-- pytest.mark.skip(reason="Slurm cluster") -->``).  This
plugin, loaded with ``-p tests.support.docs.codeblocks``, adds what documented commands need:

* **Where.** Every block runs at the root of a copy of the repository (git's tracked and
  unignored files, the ``.venv`` linked), a page's blocks in order, so that a later command finds
  what an earlier one on the page wrote (a run directory, a checkpoint), as it would for a user.
  Under pytest-xdist (``make test-docs``: ``--dist loadfile``) a page's blocks all run on one
  worker, and each worker has its own copy: no page depends on another's.  The user's own files
  the pages name (``train.py``, ``my.csv``, ...) are put there from ``tests/support/docs/yours/``
  (:data:`STAND_INS`).  The copy is removed at the end: the checkout is left as it was.
* **How big.** ``RANKWISE_SMOKE=1`` (``src/rankwise/cli/smoke.py``) caps what each ``rankwise``
  command does; the interpreter's ``bin/`` comes first on ``PATH`` (``rankwise``, ``python``).
* **What counts.** A block runs under ``set -e -o pipefail``: any line that fails fails the block
  (the tool itself checks only the block's last line).  A block documenting a failure says so with
  ``<!-- pytest.mark.exits(1, reason="...") -->``: it passes only with that exit status.
* **What a failure says.** The page and line, the exit status and the end of the block's output.
* **Tier.** Each block is marked ``docs`` (``tests/support/tiers.py``), with a ``timeout`` of
  :data:`TIMEOUT_S` unless the page gives one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from pytest_codeblocks.plugin import TestBlock

ROOT = Path(__file__).parents[3]
YOURS = Path(__file__).parent / "yours"
STAND_INS = {
    "train.py": "setup_loop.py",
    "my_train.py": "setup_loop.py",
    "my_script.py": "plain_ddp.py",
    "my_ddp_script.py": "plain_ddp.py",
    "train_ddp.py": "plain_ddp.py",
    "my.csv": "my.csv",
    "run.toml": "run.toml",
}
"""The files the pages name as the user's own -> the stand-in in ``tests/support/docs/yours/``."""
TIMEOUT_S = 1800
"""A block's time limit unless its page marks another (``pytest.mark.timeout(S)``): a hang's guard.
(The longest block, bench.md's two built-in benches, took 900 s beside another page's commands.)"""
TAIL = 4000
"""Characters of a failed block's stdout and stderr shown."""
PREAMBLE = "set -e -o pipefail\n"


class BlockFailed(Exception):
    """A block exited with a status its page does not document (the message is the report)."""


def repository_copy(root: Path, into: Path) -> Path:
    """The working tree of ``root`` as git sees it (tracked and unignored files, as they are now)
    copied into ``into`` with their times (so ``make`` sees the set-up done), its environment linked
    as ``.venv``, the stand-ins put at its root."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = root / name
        if source.is_file():  # not a file deleted in the working tree, nor a submodule
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name, follow_symlinks=False)
    (into / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    for name, stand_in in STAND_INS.items():
        shutil.copy2(YOURS / stand_in, into / name)
    return into


class Workspace:
    """The copy every block of this process runs in: made at its first block, removed at the
    session's end."""

    def __init__(self) -> None:
        self.path: Path | None = None

    def get(self) -> Path:
        if self.path is None:
            self.path = repository_copy(ROOT, Path(tempfile.mkdtemp(prefix="rankwise-docs-")))
        return self.path

    def remove(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


WORKSPACE = Workspace()


def pytest_configure(config: pytest.Config) -> None:
    # also declared in pyproject.toml; here too for a page outside the repository (its own rootdir)
    config.addinivalue_line("markers", "docs: a documented block, run as written")
    config.addinivalue_line(
        "markers", "exits(status, reason): a documented block that exits with this status"
    )
    if config.getoption("codeblocks", default=False):
        os.environ["RANKWISE_SMOKE"] = "1"
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        bin_dir = str(Path(sys.executable).parent)
        os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, TestBlock):
            item.add_marker(pytest.mark.docs)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TIMEOUT_S))


def pytest_sessionfinish() -> None:
    WORKSPACE.remove()


def _tail(text: bytes | str | None) -> str:
    text = text.decode(errors="replace") if isinstance(text, bytes) else text or ""
    return text[-TAIL:].rstrip() or "(nothing)"


def failure(item: TestBlock, status: int, stdout, stderr, expected: int = 0) -> str:
    """What a failed block says: where it is, what it ran, how it ended, its last output."""
    code = item.obj.code.removeprefix(PREAMBLE)
    return (
        f"{item.path.relative_to(ROOT) if item.path.is_relative_to(ROOT) else item.path}, the "
        f"block at line {item.obj.lineno} exited {status} (the page documents {expected}):\n"
        f"{code.rstrip()}\n--- stdout (end) ---\n{_tail(stdout)}\n--- stderr (end) ---\n"
        f"{_tail(stderr)}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if not isinstance(item, TestBlock):
        return (yield)
    block = item.obj
    mark = item.get_closest_marker("exits")
    expected = mark.args[0] if mark else 0
    code, here = block.code, os.getcwd()
    if block.syntax in ("sh", "bash"):
        block.code = PREAMBLE + code
    os.chdir(WORKSPACE.get())
    try:
        result = yield
    except subprocess.CalledProcessError as e:
        if e.returncode != expected:
            raise BlockFailed(failure(item, e.returncode, e.stdout, e.stderr, expected)) from None
        return None
    finally:
        block.code = code
        os.chdir(here)
    if expected:
        raise BlockFailed(failure(item, 0, "", "", expected))
    return result
