"""The zoo runner's modules (scripts/zoo: a directory `python scripts/zoo` runs, not a package)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

RUNNER = Path(__file__).resolve().parents[2] / "scripts" / "zoo"


def runner(name: str) -> ModuleType:
    """scripts/zoo/<name>.py, imported as the runner imports it."""
    if str(RUNNER) not in sys.path:
        sys.path.insert(0, str(RUNNER))
    return importlib.import_module(name)
