"""Test tiers, marked explicitly (the markers are declared in pyproject.toml; tests/conftest.py
applies them).

A test's tier is, in order:

1. its own marker (``@pytest.mark.multiproc`` on the test or its class, ``pytestmark = ...`` in its
   module);
2. else the highest tier a fixture it uses declares with :func:`starts_processes` (a fixture that
   starts ranks or commands marks every test that uses it, with no mark on the test);
3. else ``unit``: no process started, nothing installed, no root -- ``make test-fast`` (``pytest -m
   unit``).

``docs`` is the documentation tier: the command blocks of README.md and docs/, run as written by
``make test-docs`` (``tests/support/docs/codeblocks.py`` marks them); no test under ``tests/`` has
it.

A unit test that starts a process anyway (``subprocess``, ``multiprocessing``, ``os.fork``,
``os.posix_spawn``) fails, saying which tier to mark it with (:func:`no_process_started`, around its
fixtures' set-up and its body): a missing mark cannot hide in the fast tier.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

TIERS = ("unit", "multiproc", "multinode", "slurm", "gpu", "docs")
ORDER = {"unit": 0, "multiproc": 1, "gpu": 1, "docs": 1, "multinode": 2, "slurm": 2}
"""Which tier wins when a test's fixtures declare several (two hosts start processes too)."""

F = TypeVar("F", bound=Callable)


def starts_processes(tier: str = "multiproc") -> Callable[[F], F]:
    """Declare that a fixture starts processes: every test using it is in ``tier``.  Put it under
    ``@pytest.fixture``::

        @pytest.fixture(scope="module")
        @starts_processes()
        def trained_run(tmp_path_factory): ...
    """
    assert tier in TIERS and tier != "unit", tier

    def declare(function: F) -> F:
        function.__rankwise_tier__ = tier  # type: ignore[attr-defined]
        return function

    return declare


def fixture_definitions(item: pytest.Item) -> Iterator:
    """The definitions of every fixture ``item`` uses (each has ``func`` and ``scope``)."""
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        yield from fixtureinfo.name2fixturedefs.get(name, ()) if fixtureinfo else ()


def tier_of(item: pytest.Item) -> str:
    """The tier ``item`` runs in (see the module docstring)."""
    explicit = [tier for tier in TIERS if item.get_closest_marker(tier)]
    if explicit:
        return max(explicit, key=ORDER.__getitem__)
    declared = ["unit"]
    for definition in fixture_definitions(item):
        declared.append(getattr(definition.func, "__rankwise_tier__", "unit"))
    return max(declared, key=ORDER.__getitem__)


def shares_a_started_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a module-scoped fixture that starts processes (its tests then share one
    pytest-xdist worker, so it runs once)."""
    return any(
        definition.scope == "module" and hasattr(definition.func, "__rankwise_tier__")
        for definition in fixture_definitions(item)
    )


class StartedAProcess(AssertionError):
    pass


@contextlib.contextmanager
def no_process_started(nodeid: str) -> Iterator[None]:
    """Fail a unit-tier test that starts a process: it belongs in the ``multiproc`` tier (or
    higher)."""

    def refuse(what: str) -> Callable:
        def refused(*args, **kwargs):
            raise StartedAProcess(
                f"{nodeid} is in the unit tier but started a process ({what}): mark it "
                "@pytest.mark.multiproc (or use a fixture declared with "
                "tests.support.tiers.starts_processes)"
            )

        return refused

    # os.system is left alone: a unit test pickles it as an attacker's payload
    # (tests/checkpoint/test_loading.py), which needs the real function, and runs it as `touch`
    # once.
    patches = [
        (subprocess.Popen, "_execute_child", "subprocess"),
        (multiprocessing.process.BaseProcess, "start", "multiprocessing"),
        (os, "fork", "os.fork"),
        (os, "posix_spawn", "os.posix_spawn"),
        (os, "posix_spawnp", "os.posix_spawnp"),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    for owner, name, what in patches:
        setattr(owner, name, refuse(what))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
