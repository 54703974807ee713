"""What the compat tests need to check a record's target on the installed releases."""

from __future__ import annotations

import importlib
import importlib.metadata


def resolve(dotted: str) -> object:
    """The object a record's target names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def installed(library: str) -> bool:
    """Whether the distribution is installed (``python``: always)."""
    if library == "python":
        return True
    try:
        importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
