"""The checkpoint protocol: weights, optimizer, scheduler, progress and RNG, written atomically and
verified.

Layout of a checkpoints folder (``<run>/checkpoints/`` for ``rankwise train``)::

    step-00000420/
        model.safetensors     unwrapped weights (no ``module.`` prefix)
        training_state.pt     scheduler, precision scaler, step, the loop's extras, RNG per rank
        optimizer.pt | sharded/ | deepspeed/
                              optimizer state, as the strategy keeps it (whole, FSDP shards,
                              DeepSpeed partitions)
        config.json           the run configuration          } files the loop adds
        model_spec.json       how to rebuild the architecture  } (``rankwise train``;
        labels.json           label names in class-id order    }  a user's loop may add
        tokenizer.json        the exact tokenizer used         }  its own)
        manifest.json         SHA-256 of every file above; written last
    latest -> step-00000420   updated only after the directory is complete

A checkpoint is written into a hidden temporary directory, every file fsynced, the
directory renamed into place and its parent fsynced; only then does ``latest`` move.
A crash at any moment leaves either the old or the new checkpoint, never half of one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from rankwise.checkpoint.atomic_files import (
    fsync_dir,
    fsync_file,
    load_weights_file,
    save_weights_file,
    sha256_of,
    strip_module_prefix,
)
from rankwise.errors import CheckpointError, CollectiveSaveError, ConfigError

WEIGHTS = "model.safetensors"
STATE = "training_state.pt"
MANIFEST = "manifest.json"


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read weights from a safetensors/torch file or a checkpoint directory."""
    path = Path(path)
    if path.is_dir():
        path = resolve(path) / WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"no weights at {path}")
    if path.suffix == ".safetensors":
        state = load_weights_file(path)
    else:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
        state = (
            loaded.get("model", loaded)
            if isinstance(loaded, dict) and "model" in loaded
            else loaded
        )
    return strip_module_prefix(state)


def rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def staging_dir(root: str | os.PathLike, step: int) -> Path:
    """The hidden directory a checkpoint is assembled in (a fixed name every rank can compute)."""
    return Path(root) / f".tmp-step-{step:08d}"


def begin_checkpoint(root: str | os.PathLike, step: int) -> Path:
    """Create an empty staging directory (rank 0 only; other ranks wait before writing into it)."""
    tmp = staging_dir(root, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit_checkpoint(
    root: str | os.PathLike,
    step: int,
    *,
    weights: dict[str, torch.Tensor],
    training_state: dict,
    files: Mapping[str, str | os.PathLike | bytes] | None = None,
    keep: int = 2,
    meta: dict | None = None,
) -> Path:
    """Add weights, training state and ``files`` (name -> text, or a path to copy) to the staging
    directory, checksum everything, rename it into place as ``root/step-NNNNNNNN``, point
    ``root/latest`` at it and keep the newest ``keep`` (rank 0 only).  ``meta`` (small facts such as
    the world size) goes into the manifest, readable without loading anything else."""
    root = Path(root)
    tmp = staging_dir(root, step)
    if not tmp.is_dir():
        tmp = begin_checkpoint(root, step)
    final = root / f"step-{step:08d}"
    save_weights_file(weights, tmp / WEIGHTS)
    torch.save(training_state, tmp / STATE)
    for name, content in (files or {}).items():
        if isinstance(content, bytes):
            (tmp / name).write_bytes(content)
        elif isinstance(content, str):
            (tmp / name).write_text(content, encoding="utf-8")
        else:
            shutil.copyfile(content, tmp / name)
    # Strategy files (FSDP shards, DeepSpeed state) live in subdirectories: checksum them all.
    written = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {
        "step": step,
        "meta": meta or {},
        "files": {
            str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": sha256_of(p)}
            for p in written
        },
    }
    for p in written:
        fsync_file(p)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    fsync_file(tmp / MANIFEST)
    for directory in {p.parent for p in written} | {tmp}:
        fsync_dir(directory)
    if final.exists():  # re-saving the same step (e.g. epoch end == max_steps): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _point_latest(root, final.name)
    fsync_dir(root)
    # Only checkpoints older than this one are pruned: newer ones (from before a resume at an
    # earlier step) are another timeline the user may still want, and the one just written always
    # stays.
    older = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name < final.name)
    for old in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _point_latest(root: Path, name: str) -> None:
    link = root / "latest"
    tmp = root / f".latest-{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(name, tmp)
    os.replace(tmp, link)


def resolve(path: str | os.PathLike) -> Path:
    """A checkpoint directory from a step directory, ``.../latest`` or a run's ``checkpoints``
    folder."""
    path = Path(path)
    if (path / "checkpoints").is_dir() and not (path / MANIFEST).exists():
        path = path / "checkpoints"
    if (path / "latest").exists() and not (path / MANIFEST).exists():
        path = path / "latest"
    path = path.resolve()
    if not (path / MANIFEST).is_file():
        raise CheckpointError(f"{path} is not a complete rankwise checkpoint (no {MANIFEST})")
    return path


def _read_manifest(path: Path) -> dict:
    try:
        return json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {path}: unreadable {MANIFEST} ({e})") from None


def verify(path: Path) -> dict:
    """The manifest, after checking every file it lists against its size and SHA-256."""
    manifest = _read_manifest(path)
    for name, expected in manifest["files"].items():
        file = path / name
        if isinstance(expected, str):  # written before sizes were recorded
            expected = {"sha256": expected}
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        if "size" in expected and file.stat().st_size != expected["size"]:
            raise CheckpointError(
                f"checkpoint {path} is corrupt: {name} has {file.stat().st_size} bytes, the "
                f"manifest says {expected['size']} (truncated?)"
            )
        if sha256_of(file) != expected["sha256"]:
            raise CheckpointError(
                f"checkpoint {path} is corrupt: {name} does not match its checksum"
            )
    return manifest


def find_loadable(path: str | os.PathLike, strict: bool = False) -> tuple[Path, list[str]]:
    """The newest verified checkpoint under ``path`` and a warning for each newer one that failed.

    ``path`` naming one step directory means exactly that one.  A run directory, its
    ``checkpoints`` folder or ``latest`` means the newest that verifies: when ``latest`` is
    truncated or corrupt, the previous checkpoints are tried in turn (unless ``strict``).
    """
    given = Path(path)
    if (given / MANIFEST).is_file() and given.name != "latest":
        verify(given.resolve())
        return given.resolve(), []
    warnings = []
    try:
        newest = resolve(given)
        folder = newest.parent
    except CheckpointError as e:
        # e.g. `latest` dangling: fall back on the step directories themselves
        folder = (
            given.parent
            if given.name == "latest"
            else given / "checkpoints"
            if (given / "checkpoints").is_dir()
            else given
        )
        steps = sorted((p for p in folder.glob("step-*") if p.is_dir()), reverse=True)
        if not steps or strict:
            raise
        warnings.append(f"{e}; trying the checkpoints in {folder}")
        newest = steps[0]
    # Only older ones: a newer step directory belongs to another timeline (see commit_checkpoint).
    candidates = [newest] + sorted(
        (p for p in folder.glob("step-*") if p.is_dir() and p.name < newest.name), reverse=True
    )
    for candidate in candidates:
        try:
            verify(candidate)
        except CheckpointError as e:
            if strict:
                raise
            warnings.append(f"{e}; trying an earlier checkpoint")
            continue
        if warnings:
            warnings.append(f"resuming from {candidate} instead")
        return candidate, warnings
    raise CheckpointError(f"no loadable checkpoint under {newest.parent}: " + "; ".join(warnings))


def manifest_meta(path: str | os.PathLike) -> dict:
    """The facts a checkpoint's manifest records (world size, strategy), without verifying or
    loading it."""
    return _read_manifest(resolve(path)).get("meta", {})


def check_compatible(
    directory: str | os.PathLike,
    meta: dict,
    strategy: str,
    world_size: int,
    *,
    portable: bool = False,
) -> None:
    """Refuse a checkpoint this run cannot continue (``meta``: its manifest's or state's facts).
    ``portable``: the writing strategy's state loads under this one at any world size
    (``rankwise.strategies.portable``: every strategy this installation knows); otherwise only the
    same strategy at the same world size continues it."""
    if portable:
        return
    if meta.get("strategy", strategy) != strategy:
        raise ConfigError(
            f"checkpoint {directory} was written by strategy {meta['strategy']!r}, whose state is "
            f"sharded per rank (or {strategy!r}'s is): resume it with {meta['strategy']!r}, or "
            "start a new run from its weights (rankwise export, model.init_weights)"
        )
    if meta["world_size"] != world_size:
        raise ConfigError(
            f"checkpoint {directory} was written at world size {meta['world_size']}, this run has "
            f"{world_size}, and {strategy}'s state is sharded per rank: resume with the same "
            "number of processes, or start a new run from its weights (rankwise export, "
            "model.init_weights)"
        )


def checked_write(rank: int, staging: Path, write, *args, **kwargs) -> tuple[object, str | None]:
    """``(write(...)'s result, None)``, or ``(None, a message naming the rank and the path)`` for
    whatever it raised (disk full, permissions, an unpicklable ``extra``), so that no rank leaves
    the others waiting in the next collective of the save."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        return write(*args, **kwargs), None
    except CollectiveSaveError:
        raise  # a library's own collective save broke half-way: the ranks cannot agree any more
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        where = getattr(e, "filename", None) or staging
        return None, f"rank {rank}: cannot write {where}: {getattr(e, 'strerror', None) or e}"
