"""The strategy a launcher chose for a script: ``rankwise launch --strategy NAME --precision P --set
k=v``.

The launcher validates the choice before any process starts and hands it to every worker in
the environment (``RANKWISE_STRATEGY``, ``RANKWISE_PRECISION``, ``RANKWISE_OPTIONS``, as
torchrun hands over ``RANK``).  ``rankwise.setup()`` in the script then needs no strategy of
its own: it takes the launcher's, else ``ddp`` when it was started as one of several
processes, else ``single``.  A script that names one the launcher contradicts is refused,
naming both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rankwise.errors import ConfigError
from rankwise.precision import PRECISIONS
from rankwise.strategies import check_world_size, lookup, resolve_options, unavailable
from rankwise.strategies.options import Options, parse_value

STRATEGY, PRECISION, OPTIONS = "RANKWISE_STRATEGY", "RANKWISE_PRECISION", "RANKWISE_OPTIONS"
"""The variables a launcher sets for its workers."""


@dataclass(frozen=True)
class Choice:
    """A strategy, a precision and the strategy's options; ``None`` where nobody chose."""

    strategy: str | None = None
    precision: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Keys of the strategy's own options section (``zero_stage`` for ``deepspeed``)."""

    @classmethod
    def from_flags(
        cls, strategy: str | None, precision: str | None, settings: list[str], world_size: int
    ) -> Choice:
        """From ``--strategy``, ``--precision`` and ``--set section.key=value`` (the strategy's
        section only) for a job of ``world_size`` processes; validated here, so a bad choice fails
        before any process starts."""
        if strategy is None and settings:
            # what the script would get; --set names its section
            strategy = "ddp" if world_size > 1 else "single"
        try:
            variant = lookup(strategy) if strategy else None
        except ValueError as e:
            raise ConfigError(f"--strategy: {e}") from None
        options: dict[str, Any] = {}
        section = variant.cls.options_section if variant else None
        for item in settings:
            key, equals, raw = item.partition("=")
            prefix, _, name = key.strip().rpartition(".")
            if not equals or not name:
                raise ConfigError(f"--set expects section.key=value, got {item!r}")
            if prefix != section:
                where = (
                    f"its options are the {section!r} section" if section else "it takes no options"
                )
                raise ConfigError(
                    f"--set {key.strip()}: strategy {strategy!r} reads no {prefix or name!r} "
                    f"section; {where}"
                )
            options[name] = parse_value(raw.strip())
        choice = cls(strategy, precision, options)
        choice.validate()
        choice.check_launch(world_size)
        return choice

    def validate(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ConfigError(
                f"--precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}"
            )
        if self.strategy is not None:
            problem = unavailable(self.strategy)
            if problem:
                raise ConfigError(problem)
            resolve_options(lookup(self.strategy), self.options or None)

    def check_launch(self, world_size: int, launcher: str = "torchrun") -> None:
        """Refuse, before starting anything, a strategy this launcher and job size cannot run."""
        if self.strategy is None:
            return
        variant = lookup(self.strategy)
        needs = variant.settings.get("launch.launcher") or variant.cls.launcher or launcher
        if needs != launcher:
            raise ConfigError(
                f"--strategy {self.strategy} starts its processes with {needs}, not {launcher} (it "
                "is not started by `rankwise launch`): "
                + (
                    "run horovodrun yourself (see README)"
                    if needs == "horovodrun"
                    else f"use --strategy {variant.strategy} (the same strategy) here"
                )
            )
        check_world_size(variant, world_size)

    def environment(self) -> dict[str, str]:
        """What the workers need to see this choice."""
        env = {STRATEGY: self.strategy or "", PRECISION: self.precision or ""}
        env[OPTIONS] = json.dumps(self.options) if self.options else ""
        return {key: value for key, value in env.items() if value}

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> Choice:
        return cls(
            env.get(STRATEGY) or None,
            env.get(PRECISION) or None,
            json.loads(env.get(OPTIONS) or "{}"),
        )


def settle(
    strategy: str | None,
    precision: str | None,
    options: Options | Mapping[str, Any] | None,
    world_size: int,
    env: Mapping[str, str] = os.environ,
) -> tuple[str, str, Options | Mapping[str, Any] | None]:
    """The strategy, precision and options a process runs with: the script's, else its launcher's,
    else ``ddp`` (several processes) or ``single`` and ``32-true``.  A script's value that its
    launcher contradicts is an error naming both."""
    launched = Choice.from_environment(env)
    for what, mine, theirs in (
        ("strategy", strategy, launched.strategy),
        ("precision", precision, launched.precision),
    ):
        if mine is not None and theirs is not None and mine != theirs:
            raise ConfigError(
                f"the script asks for {what} {mine!r}, the launcher for {theirs!r} (rankwise "
                f"launch --{what} {theirs}); drop one of them"
            )
    strategy = strategy or launched.strategy or ("ddp" if world_size > 1 else "single")
    precision = precision or launched.precision or "32-true"
    if not launched.options:
        return strategy, precision, options
    # a validated options object: what was set
    if options is not None and not isinstance(options, Mapping):
        options = {key: getattr(options, key) for key in options.model_fields_set}
    merged = dict(launched.options)
    for key, value in (options or {}).items():
        if key in merged and merged[key] != value:
            raise ConfigError(
                f"the script sets option {key}={value!r}, the launcher {key}={merged[key]!r} "
                "(rankwise launch --set); drop one of them"
            )
        merged[key] = value
    return strategy, precision, merged
