"""Paths a user gives, made absolute where the command line is read: before any process starts.

A command's children do not all start where the user stood: ``verify`` runs a script in its own
scratch directory, ``bench`` runs each row and its equivalence check under the report directory,
torchrun's workers may be started by an agent elsewhere.  A relative ``--out runs/x`` that each of
them read against its own working directory named a different place in each (``make demo``'s
equivalence checks found no prepared data).  So every command resolves what the user typed here,
against the directory the user typed it in, and passes only absolute paths on.

What counts as a path:

* a flag that takes one (``--out``, ``--script``, ``--checkpoint``, ...): always;
* a flag or config key that takes a name *or* a path (``--data sentiment|PATH``, ``--model
  tiny|PATH``, ``resume=latest|DIR``): the value unless it is one of the names;
* a script's own argument (after ``--``): only one that names an existing file or directory here,
  alone or as ``--flag=value`` (anything else may be a word, a number or a pattern).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rankwise.models import model_names
from rankwise.train.config import TrainConfig

NAMES = frozenset(["latest", "sentiment", "toy", "bpe", "wordpiece", "char", *model_names()])
"""Words a name-or-path key takes that are not paths, even where a file of that name exists."""

CONFIG_PATHS: dict[str, bool] = {
    "out": True,
    "resume": False,  # or `latest`
    "data.source": False,  # or sentiment, toy
    "data.cache_dir": True,
    "data.tokenizer": False,  # or bpe, wordpiece, char
    "model.name": False,  # or tiny, small, base, ... (rankwise.models.model_names)
    "model.init_weights": True,
}
"""Training config keys that hold a path: ``True`` for a path only; ``False`` for a name or a path,
taken as a path when one of that name exists here (a name, or a file that is not there, is left for
the config's own check to accept or refuse)."""


def absolute(path: str | Path) -> Path:
    """``path`` against the working directory, ``~`` expanded; not resolved through symlinks (the
    user's spelling of a linked directory stays)."""
    return Path(path).expanduser().absolute()


def absolute_or_none(path: str | Path | None) -> Path | None:
    return None if path is None else absolute(path)


def config_value(key: str, value: Any) -> Any:
    """A config key's value with a path made absolute (any other value unchanged)."""
    if key not in CONFIG_PATHS or not isinstance(value, str) or not value:
        return value
    if not CONFIG_PATHS[key] and (value in NAMES or not _exists(value)):
        return value
    return str(absolute(value))


def config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every path key absolute, wherever it came from (flag, ``--set``, TOML file)."""
    updates: dict[str, dict[str, Any] | Any] = {}
    for key in CONFIG_PATHS:
        *section, name = key.split(".")
        owner = getattr(cfg, section[0]) if section else cfg
        value = getattr(owner, name)
        new = config_value(key, value)
        if new == value:
            continue
        if section:
            updates.setdefault(section[0], {})[name] = new
        else:
            updates[name] = new
    if not updates:
        return cfg
    sections = {
        name: getattr(cfg, name).model_copy(update=values)
        for name, values in updates.items()
        if isinstance(values, dict)
    }
    plain = {name: value for name, value in updates.items() if not isinstance(value, dict)}
    return cfg.model_copy(update={**plain, **sections})


def overrides(items: Iterable[str]) -> list[str]:
    """``--set KEY=VALUE`` items with a path value made absolute (as JSON, so any character
    survives the config parser)."""
    resolved = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if sep and key in CONFIG_PATHS:
            text = raw.strip()
            try:
                decoded = json.loads(text)
            except ValueError:
                decoded = text  # a bare word: the config parser takes it as a string too
            if isinstance(decoded, str) and decoded:
                new = config_value(key, decoded)
                if new != decoded:
                    item = f"{key}={json.dumps(new)}"
        resolved.append(item)
    return resolved


def script_arguments(args: Iterable[str]) -> tuple[str, ...]:
    """A script's own arguments, each that names an existing file or directory here (alone or after
    ``--flag=``) made absolute: the script may run in another directory (``verify``'s scratch)."""
    out = []
    for arg in args:
        flag, sep, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        if value and not Path(value).is_absolute() and _exists(value):
            arg = f"{flag}{sep}{absolute(value)}"
        out.append(arg)
    return tuple(out)


def _exists(value: str) -> bool:
    try:
        return Path(value).expanduser().exists()
    except (OSError, ValueError):  # a name too long, a NUL: not a path
        return False
