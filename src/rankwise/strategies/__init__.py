"""Strategy registry: every module in this package defines one strategy and registers it.

Adding a strategy is adding one file here with a ``@register`` class; modules are
discovered, so nothing else needs editing.  Optional libraries (DeepSpeed, Horovod, ...)
are imported inside the strategy, not at module import, so discovery never fails.

A *variant* is a registered name for a strategy with some settings fixed, e.g.
``deepspeed-zero3`` (``deepspeed.zero_stage=3``) or ``ddp-spawn``
(``launch.launcher=spawn``): ``--strategy deepspeed-zero3`` and
``rankwise.setup("deepspeed-zero3")`` work like any other name, and benchmarks and
tests list variants instead of keeping alias tables of their own.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any

from rankwise.strategies.base import LoopFacts, Strategy


@dataclass(frozen=True)
class Variant:
    name: str
    """The name users give (``--strategy``, ``rankwise.setup``)."""
    strategy: str
    """The registered strategy class it runs."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Dotted config keys the variant fixes, e.g. ``{"deepspeed.zero_stage": 3}``."""
    description: str = ""

    @property
    def cls(self) -> type[Strategy]:
        return _REGISTRY[self.strategy]

    def options_for(self, section: str | None) -> dict[str, Any]:
        """The variant's settings inside one config section, keys relative to it."""
        prefix = f"{section}."
        return {key[len(prefix):]: value for key, value in self.settings.items() if section and key.startswith(prefix)}


_REGISTRY: dict[str, type[Strategy]] = {}
_VARIANTS: dict[str, Variant] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: register a strategy under ``cls.name`` (also a variant with nothing fixed)."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"strategy name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    _VARIANTS[cls.name] = Variant(cls.name, cls.name, {}, cls.description)
    return cls


def register_variant(name: str, strategy: str, settings: dict[str, Any], description: str) -> None:
    """Register ``name`` as ``strategy`` with ``settings`` (dotted config keys) fixed."""
    if name in _VARIANTS and _VARIANTS[name].settings != settings:
        raise ValueError(f"strategy name {name!r} registered twice")
    _VARIANTS[name] = Variant(name, strategy, dict(settings), description)


_discovered = False


def _discover() -> None:
    # A flag, not "is the registry empty": importing one strategy module directly registers it alone.
    global _discovered
    if _discovered:
        return
    for module in pkgutil.iter_modules(__path__):
        if module.name not in ("base", "options"):
            importlib.import_module(f"{__name__}.{module.name}")
    _discovered = True


def strategy_names() -> list[str]:
    """Every name ``--strategy`` takes: strategies and their variants."""
    _discover()
    return sorted(_VARIANTS)


def lookup(name: str) -> Variant:
    _discover()
    try:
        return _VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(sorted(_VARIANTS))}") from None


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class a name (or variant name) runs."""
    return lookup(name).cls


__all__ = ["LoopFacts", "Strategy", "Variant", "get_strategy", "lookup", "register", "register_variant",
           "strategy_names"]
