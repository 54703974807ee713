"""mypy's settings, read from pyproject.toml: every function of the tools is annotated (the records
that cross a process boundary are checked as strictly as ``mypy --strict`` does, by name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.unit

PYPROJECT = Path(__file__).parents[1] / "pyproject.toml"


def _overrides() -> list[dict]:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["mypy"]["overrides"]


def test_every_function_of_the_tools_is_annotated():
    """One override covers the tools package and everything under it, so a new module there is
    checked from its first commit (not a list of modules that a new one is missing from)."""
    covering = [
        o
        for o in _overrides()
        if o.get("disallow_untyped_defs") and o.get("disallow_incomplete_defs")
    ]
    modules = {m for o in covering for m in o["module"]}
    assert {"rankwise.tools", "rankwise.tools.*"} <= modules, modules
