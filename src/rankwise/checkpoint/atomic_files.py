"""Files written so that a crash at any moment leaves the old version or the new one, never half of
one."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def user_file_mode() -> int:
    """The mode a file the user creates gets: ``0o666`` less the process's umask (read from /proc,
    which leaves the umask untouched; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path next to ``path``; once the block has written it: fsync, rename onto
    ``path``, fsync the directory.  A crash at any moment leaves the old file or the new one whole.
    The temporary name is this writer's own: nodes sharing a run directory (one filesystem, one
    ``--out``) may write the same file at once, and each rename is whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        # Some writers create their file owner-only (safetensors: 0600), and the rename would keep
        # it so: a serving process of another user, or a team's shared directory, could not read the
        # weights. (a filesystem without modes: the file as it was written)
        with contextlib.suppress(OSError):
            os.chmod(tmp, user_file_mode())
        fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def strip_module_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept weights saved from a DDP/DataParallel wrapper (``module.`` prefix) or plain."""
    if state and all(key.startswith("module.") for key in state):
        return {key[len("module.") :]: value for key, value in state.items()}
    return state


TIED = "rankwise_tied"
"""Safetensors metadata key: JSON ``{key: the key whose tensor it shares}`` for tied parameters."""


def memory_of(tensor: torch.Tensor) -> tuple:
    """What makes two tensors the same values in the same memory (tied parameters: GPT-2's lm_head
    and wte)."""
    return (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def cpu_copies(
    state: dict[str, torch.Tensor], convert=lambda t: t.detach().cpu()
) -> dict[str, torch.Tensor]:
    """``convert`` applied to each tensor once: keys that shared memory share their copy too."""
    copies: dict[tuple, torch.Tensor] = {}
    result = {}
    for key, value in state.items():
        where = memory_of(value)
        if where not in copies:
            copies[where] = convert(value)
        result[key] = copies[where]
    return result


def untie(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """One entry per tensor in memory, and ``{alias: kept key}`` for the keys that shared it."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[object, str] = {}
    for key, value in state.items():
        where = memory_of(value)
        if where in first and value.numel():
            aliases[key] = first[where]
        else:
            first.setdefault(where, key)
            kept[key] = value
    return kept, aliases


def save_weights_file(
    state: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict | None = None
) -> None:
    """Safetensors, one copy of each tied tensor (safetensors refuses shared memory); the ties go in
    the metadata, and :func:`load_weights_file` restores them."""
    kept, aliases = untie(strip_module_prefix(state))
    metadata = {**(metadata or {}), **({TIED: json.dumps(aliases)} if aliases else {})}
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in kept.items()},
        str(path),
        metadata=metadata or None,
    )
    with contextlib.suppress(OSError):
        os.chmod(path, user_file_mode())  # (safetensors writes 0600 whatever the umask)


def load_weights_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A safetensors file's weights; a tied key is the same tensor as the key it was tied to."""
    with safe_open(str(path), framework="pt") as handle:
        tied = json.loads((handle.metadata() or {}).get(TIED, "{}"))
    state = load_file(str(path))
    for alias, source in tied.items():
        state[alias] = state[source]
    return state


def write_weights(state: dict[str, torch.Tensor], path: str | os.PathLike) -> Path:
    """Write weights as safetensors atomically (temp file, fsync, rename, directory fsync)."""
    with atomic_path(path) as tmp:
        save_weights_file(state, tmp)
    return Path(path)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
