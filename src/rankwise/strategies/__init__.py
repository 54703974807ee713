"""Strategy registry: every module in this package defines one strategy and registers it.

Adding a strategy is adding one file here with a ``@register`` class; modules are
discovered, so nothing else needs editing.  Optional libraries (DeepSpeed, Horovod, ...)
are imported inside the strategy, not at module import, so discovery never fails.
"""

from __future__ import annotations

import importlib
import pkgutil

from rankwise.strategies.base import Strategy

_REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"strategy name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


_discovered = False


def _discover() -> None:
    # A flag, not "is the registry empty": importing one strategy module directly registers it alone.
    global _discovered
    if _discovered:
        return
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")
    _discovered = True


def strategy_names() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def get_strategy(name: str) -> type[Strategy]:
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(sorted(_REGISTRY))}") from None


__all__ = ["Strategy", "register", "strategy_names", "get_strategy"]
