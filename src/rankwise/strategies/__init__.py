"""Strategy registry: every module in this package defines one strategy and registers it.

Adding a strategy is adding one file here with a ``@register`` class; modules are
discovered, so nothing else needs editing.  Optional libraries (DeepSpeed, Horovod, ...)
are imported inside the strategy, not at module import, so discovery never fails.

A *variant* is a registered name for a strategy with some settings fixed, e.g.
``deepspeed-zero3`` (``deepspeed.zero_stage=3``) or ``ddp-spawn``
(``launch.launcher=spawn``): ``--strategy deepspeed-zero3`` and
``rankwise.setup("deepspeed-zero3")`` work like any other name, and benchmarks and
tests list variants instead of keeping alias tables of their own.  :func:`resolve_options`
merges a variant's fixed settings into the options a run gives, refusing a contradiction.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rankwise.errors import CheckpointError, ConfigError
from rankwise.strategies.base import LoopFacts, Strategy
from rankwise.strategies.facts import Facts
from rankwise.strategies.options import Options


@dataclass(frozen=True)
class Variant:
    name: str
    """The name users give (``--strategy``, ``rankwise.setup``)."""
    strategy: str
    """The registered strategy class it runs."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Dotted config keys the variant fixes, e.g. ``{"deepspeed.zero_stage": 3}``."""
    description: str = ""
    own_facts: Facts | None = None
    """Facts the variant declares where its settings change them (else its class's)."""

    @property
    def cls(self) -> type[Strategy]:
        return _REGISTRY[self.strategy]

    @property
    def facts(self) -> Facts | None:
        """What ``rankwise plan`` and ``rankwise bench`` know of it (:mod:`.facts`)."""
        return self.own_facts or self.cls.strategy_facts

    @property
    def about(self) -> str:
        """One line for bench's table: the one its facts give where it declared them, else its
        description (a subclass inherits its parent's facts, not its parent's line)."""
        declared = self.own_facts or (
            self.cls.strategy_facts if "strategy_facts" in vars(self.cls) else None
        )
        return declared.about if declared and declared.about else self.description

    def options_for(self, section: str | None) -> dict[str, Any]:
        """The variant's settings inside one config section, keys relative to it."""
        prefix = f"{section}."
        return {
            key[len(prefix) :]: value
            for key, value in self.settings.items()
            if section and key.startswith(prefix)
        }


_REGISTRY: dict[str, type[Strategy]] = {}
_VARIANTS: dict[str, Variant] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: register a strategy under ``cls.name`` (also a variant with nothing
    fixed)."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"strategy name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    _VARIANTS[cls.name] = Variant(cls.name, cls.name, {}, cls.description)
    return cls


def register_variant(
    name: str,
    strategy: str,
    settings: dict[str, Any],
    description: str,
    facts: Facts | None = None,
) -> None:
    """Register ``name`` as ``strategy`` with ``settings`` (dotted config keys) fixed, and the facts
    those settings give it (``None``: its strategy's)."""
    if name in _VARIANTS and _VARIANTS[name].settings != settings:
        raise ValueError(f"strategy name {name!r} registered twice")
    _VARIANTS[name] = Variant(name, strategy, dict(settings), description, facts)


_discovered = False


def _discover() -> None:
    # A flag, not "is the registry empty": importing one strategy module directly registers it
    # alone.
    global _discovered
    if _discovered:
        return
    for module in pkgutil.iter_modules(__path__):
        if module.name not in ("base", "facts", "options"):
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
        raise ValueError(
            f"unknown strategy {name!r}; choose one of {', '.join(sorted(_VARIANTS))}"
        ) from None


def with_facts() -> list[Variant]:
    """Every registered name ``rankwise plan`` and ``rankwise bench`` have facts for, the least
    sharded first (one-process strategies before the rest), then by name."""
    _discover()
    known = [variant for variant in _VARIANTS.values() if variant.facts is not None]
    return sorted(
        known,
        key=lambda v: (v.cls.multiprocess, len(v.facts.shards) if v.facts else 0, v.name),
    )


def unavailable(name: str) -> str | None:
    """Why strategy ``name`` cannot run here (its library is not installed, with the install
    command), else None."""
    try:
        lookup(name).cls.check_available()
    except ImportError as e:
        return str(e)
    return None


def portable(written_by: str, resumed_by: str) -> bool:
    """Whether a checkpoint ``written_by`` one strategy continues under ``resumed_by`` at any world
    size: each keeps whole state (one optimizer file) or shards that regroup on load (FSDP's DCP
    shards, DeepSpeed's ZeRO partitions); every strategy reads its own back into the whole state by
    parameter name (``Strategy.read_whole_state``), which every strategy loads."""
    try:
        written, resumed = lookup(written_by).cls, lookup(resumed_by).cls
    except ValueError:  # a strategy this installation does not know wrote it
        return False
    return all(kind.whole_state or kind.reshards for kind in (written, resumed))


def format_owner(directory: Path, written_by: str | None = None) -> type[Strategy]:
    """The strategy whose checkpoint format ``directory`` holds, to read it back
    (``Strategy.read_whole_state``): ``written_by`` (the name its manifest records) where that
    strategy claims it, else the first registered one that does; a checkpoint saved without
    optimizer state, which none claims, is its writer's."""
    _discover()
    writer = _VARIANTS[written_by].cls if written_by in _VARIANTS else None
    for cls in ([writer] if writer else []) + sorted(
        set(_REGISTRY.values()) - {writer}, key=lambda c: c.name
    ):
        if cls.claims(directory):
            return cls
    if writer is not None:
        return writer
    raise CheckpointError(
        f"{directory} was written by strategy {written_by!r}, which this installation does not "
        f"know, and no strategy it knows ({', '.join(sorted(_REGISTRY))}) reads its format"
    )


def check_world_size(variant: Variant, world_size: int) -> None:
    """Refuse a one-process strategy in a job of several processes."""
    if not variant.cls.multiprocess and world_size > 1:
        raise ConfigError(
            f"strategy {variant.name!r} runs in one process, but the job has {world_size} "
            "processes; drop --nproc-per-node / --nnodes (or the launcher), or use a "
            "multi-process strategy such as ddp"
        )


def resolve_options(
    variant: Variant, options: Options | Mapping[str, Any] | None
) -> Options | None:
    """The strategy's options: the given ones with the variant's fixed settings applied,
    validated."""
    cls = variant.cls
    fixed = variant.options_for(cls.options_section)
    if cls.options_cls is None:
        if options:
            raise ConfigError(f"strategy {variant.name!r} takes no options (got {dict(options)})")
        return None
    if options is None:
        given: dict[str, Any] = {}
    elif isinstance(options, cls.options_cls):
        given = {key: getattr(options, key) for key in options.model_fields_set}
    else:
        given = dict(options)
    clashes = {key: given[key] for key in fixed if key in given and given[key] != fixed[key]}
    if clashes:
        key, value = next(iter(clashes.items()))
        raise ConfigError(
            f"strategy {variant.name!r} sets {cls.options_section}.{key}={fixed[key]!r}; it was "
            f"also given {value!r}"
        )
    # An options object keeps its defaults too; a mapping holds only what was given.
    base = options.model_dump() if isinstance(options, cls.options_cls) else given
    try:
        merged = cls.options_cls.model_validate({**base, **fixed})
    except ValidationError as e:
        problems = "; ".join(
            f"{cls.options_section}.{'.'.join(map(str, err['loc']))}: "
            + ("no such option" if err["type"] == "extra_forbidden" else err["msg"])
            + (f" (got {err['input']!r})" if "input" in err else "")
            + _did_you_mean(err, cls.options_section, list(cls.options_cls.model_fields))
            for err in e.errors()
        )
        raise ConfigError(f"strategy {variant.name!r}: {problems}") from None
    cls.check_options(merged)
    return merged


def _did_you_mean(error: Mapping[str, Any], section: str | None, fields: list[str]) -> str:
    """For an unknown option, the known one it most resembles (``ddp.bucket_cap`` ->
    ``ddp.bucket_cap_mb``)."""
    if error.get("type") != "extra_forbidden":
        return ""
    close = difflib.get_close_matches(str(error["loc"][-1]), fields, n=1, cutoff=0.5)
    return (
        f"; did you mean {section}.{close[0]}?"
        if close
        else f"; {section} takes {', '.join(fields)}"
    )


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class a name (or variant name) runs."""
    return lookup(name).cls


__all__ = [
    "Facts",
    "LoopFacts",
    "Strategy",
    "Variant",
    "check_world_size",
    "format_owner",
    "get_strategy",
    "lookup",
    "register",
    "register_variant",
    "resolve_options",
    "strategy_names",
    "with_facts",
]
