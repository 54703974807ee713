"""The environment variable registry (``rankwise.envvars``) against the source: every ``RANKWISE_*``
name the code, the tests, the scripts and the examples use is registered, and every registered one
is still used."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rankwise.envvars import VARIABLES, registered
from tests.support.cli import ROOT

NAME = re.compile(r"\bRANKWISE_[A-Z0-9_]*[A-Z0-9]\b")
REGISTRY = (ROOT / "src/rankwise/envvars.py").resolve()
SHELL_FILES = ("Makefile", "scripts/*.sh", "examples/*.sbatch", "examples/*.yaml")


def names_in_python(text: str) -> set[str]:
    """``RANKWISE_*`` names inside string literals: what ``os.environ`` is indexed with, directly or
    through a constant (a Python identifier such as ``RANKWISE_DIR`` is not an environment
    variable)."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(NAME.findall(node.value))
    return found


def used_names() -> dict[str, set[str]]:
    """Each ``RANKWISE_*`` name the repository uses -> the files that use it."""
    used: dict[str, set[str]] = {}
    python = [
        p for top in ("src", "tests", "examples", "scripts") for p in (ROOT / top).rglob("*.py")
    ]
    files = [(p, names_in_python) for p in python]
    files += [
        (p, lambda text: set(NAME.findall(text)))
        for pattern in SHELL_FILES
        for p in ROOT.glob(pattern)
    ]
    for path, find in files:
        # the registry and this test name them all
        if path.resolve() in (Path(__file__).resolve(), REGISTRY):
            continue
        for name in find(path.read_text(encoding="utf-8")):
            used.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return used


def test_the_scan_reads_string_literals_not_identifiers():
    source = 'import os\nRANKWISE_DIR = "/x"\nVAR = "RANKWISE_SOMETHING_NEW"\nos.environ.get(VAR)\n'
    assert names_in_python(source) == {"RANKWISE_SOMETHING_NEW"}
    assert "RANKWISE_STRATEGY" in used_names()  # the scan reaches launch/choice.py


def test_every_rankwise_variable_the_code_uses_is_registered():
    missing = {
        name: sorted(files) for name, files in used_names().items() if registered(name) is None
    }
    assert not missing, f"add these to src/rankwise/envvars.py (VARIABLES): {missing}"


def test_every_registered_rankwise_variable_is_used():
    used = used_names()
    stale = [
        var.name for var in VARIABLES if var.name.startswith("RANKWISE_") and var.name not in used
    ]
    assert not stale, f"registered in src/rankwise/envvars.py but used nowhere: {stale}"


def test_every_entry_is_complete_and_named_once():
    names = [var.name for var in VARIABLES]
    assert len(names) == len(set(names)), "a variable is registered twice"
    for var in VARIABLES:
        assert var.set_by and var.read_by and var.meaning, var.name
        assert var.scope in ("rankwise", "foreign", "development"), var.name
