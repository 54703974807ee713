"""What a script saves: every ``torch.save`` call, where it wrote, from which line, at which step,
and whether the state it saved carries a wrapper's ``module.`` prefix (the findings read them: a
save on every rank, a checkpoint only a wrapped model loads)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from rankwise.tools.watch.ranks import call_site, patch
from rankwise.tools.watch.records import SaveRecord
from rankwise.tools.watch.workdir import unlink_before_write


class SaveWatch:
    def __init__(self, step: Callable[[], int]):
        self.step = step
        """Returns the optimizer steps taken so far."""
        self.saves: list[SaveRecord] = []
        """Each ``torch.save``: ``path``, ``site``, ``module_prefix``, ``step``."""

    def install(self) -> None:
        patch(torch, "save", self._save)

    def _save(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        def save(
            obj: object, f: str | os.PathLike[str] | IO[bytes], *args: Any, **kwargs: Any
        ) -> Any:
            keys = list(obj.keys()) if isinstance(obj, dict) else []
            nested = [
                k
                for value in (obj.values() if isinstance(obj, dict) else [])
                if isinstance(value, dict)
                for k in value
            ]
            prefixed = any(isinstance(k, str) and k.startswith("module.") for k in keys + nested)
            watcher.saves.append(
                {
                    "path": str(Path(f).resolve())
                    if isinstance(f, (str, os.PathLike))
                    else repr(f),
                    "site": call_site(),
                    "module_prefix": prefixed,
                    "step": watcher.step(),
                }
            )
            # (a link into the user's directory: the scratch's own file, not the user's)
            unlink_before_write(f)
            return original(obj, f, *args, **kwargs)

        return save
