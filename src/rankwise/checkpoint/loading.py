"""Reading back pickled files without running code from them.

``torch.load`` unpickles, and a pickle can name any Python callable: loading a checkpoint someone
else wrote could run whatever it contains.  rankwise therefore reads every ``.pt`` file with
``weights_only=True``, torch's restricted unpickler (tensors, containers, numbers, strings),
allowing only the few classes the files it and DeepSpeed write are known to hold
(:data:`KNOWN_GLOBALS`).  DeepSpeed's engine and its checkpoint conversion read their own files with
a full unpickler; before rankwise hands a folder to them, every file in it is inspected (the
pickle's opcodes are read, nothing is run) and a file naming any other global is refused.

A file that really needs more (a checkpoint written with other libraries' objects in its state)
loads only when the user says they trust it: ``RANKWISE_TRUST_CHECKPOINT=1`` (``rankwise train
--trust-checkpoint``).
"""

from __future__ import annotations

import importlib
import os
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rankwise.errors import CheckpointError

TRUST_ENV = "RANKWISE_TRUST_CHECKPOINT"
"""Set to 1 to load pickled files whatever globals they name (only for checkpoints from someone you
trust)."""

KNOWN_GLOBALS = (
    # numpy's RNG state in training_state.pt (np.random.get_state(): an array of uint32)
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
    # DeepSpeed ZeRO's optimizer partitions (deepspeed 0.15-0.19)
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
"""The classes beyond torch's weights-only defaults that rankwise's and DeepSpeed's own files
hold."""


def trusted() -> bool:
    return os.environ.get(TRUST_ENV, "").lower() in ("1", "true", "yes")


def named_globals(path: Path) -> list[str]:
    """The globals ``path``'s pickle names beyond torch's weights-only defaults (read from its
    opcodes; nothing in it runs)."""
    try:
        return sorted(set(torch.serialization.get_unsafe_globals_in_checkpoint(path)))
    except Exception as e:  # noqa: BLE001 - a file torch cannot even open is unreadable, whatever the reason
        raise CheckpointError(f"cannot read {path}: {type(e).__name__}: {e}") from None


def unknown_globals(path: Path) -> list[str]:
    """The globals ``path`` names beyond torch's weights-only defaults and :data:`KNOWN_GLOBALS`."""
    return [name for name in named_globals(path) if name not in KNOWN_GLOBALS]


def check_safe(paths: Iterable[Path], what: str) -> None:
    """Refuse (``CheckpointError``) before another library unpickles ``paths`` fully, where one of
    them names a global rankwise does not know, unless the user trusts the checkpoint."""
    if trusted():
        return
    for path in sorted(paths):
        unknown = unknown_globals(path)
        if unknown:
            raise CheckpointError(_refusal(path, unknown, what))


def load(path: str | os.PathLike, what: str = "checkpoint") -> Any:
    """``torch.load(path)`` on the CPU with torch's weights-only unpickler and
    :data:`KNOWN_GLOBALS`; a file that names another global is refused (``CheckpointError``) unless
    the user trusts it (:data:`TRUST_ENV`)."""
    path = Path(path)
    if trusted():
        return torch.load(path, map_location="cpu", weights_only=False)
    named = named_globals(path)
    unknown = [name for name in named if name not in KNOWN_GLOBALS]
    if unknown:
        raise CheckpointError(_refusal(path, unknown, what))
    try:
        with torch.serialization.safe_globals(_objects(named)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path}: {str(e).splitlines()[-3] if len(str(e).splitlines()) > 3 else e}. If you "
            f"trust who wrote it, set {TRUST_ENV}=1 (rankwise train --trust-checkpoint)"
        ) from None


def _refusal(path: Path, unknown: list[str], what: str) -> str:
    return (
        f"{path}: this {what} file names {', '.join(unknown)}, which loading it would import and "
        "run; rankwise loads only tensors, numbers and the classes its own and DeepSpeed's files "
        f"hold. If you trust who wrote it, set {TRUST_ENV}=1 (rankwise train --trust-checkpoint)"
    )


def _objects(names: list[str]) -> list:
    """The known classes a file names, imported (only those: DeepSpeed is imported for DeepSpeed's
    files)."""
    found = []
    for name in names:
        module, _, attribute = name.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), attribute))
        except (ImportError, AttributeError) as e:
            raise CheckpointError(f"cannot load a file that holds {name}: {e}") from None
    if any(name.startswith("numpy.") for name in names):
        import numpy as np

        # An array's dtype is rebuilt through its class, which the opcodes do not name
        # (numpy.dtypes.UInt32DType).
        found += [
            type(np.dtype(kind))
            for kind in (np.uint32, np.int64, np.int32, np.float64, np.float32, np.bool_)
        ]
    return found
