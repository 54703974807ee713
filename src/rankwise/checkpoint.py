"""Atomic checkpoints: weights, optimizer, scheduler, progress, RNG, config and tokenizer.

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

import contextlib
import hashlib
import json
import os
import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"
STATE = "training_state.pt"
MANIFEST = "manifest.json"
CONFIG = "config.json"
MODEL_SPEC = "model_spec.json"
LABELS = "labels.json"
TOKENIZER = "tokenizer.json"


class CheckpointError(RuntimeError):
    pass


class CollectiveSaveError(CheckpointError):
    """A library's own collective save (DeepSpeed's) failed on this rank half-way; the job cannot continue."""


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path next to ``path``; once the block has written it: fsync, rename onto
    ``path``, fsync the directory.  A crash at any moment leaves the old file or the new one whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def strip_module_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept weights saved from a DDP/DataParallel wrapper (``module.`` prefix) or plain."""
    if state and all(key.startswith("module.") for key in state):
        return {key[len("module."):]: value for key, value in state.items()}
    return state


def write_weights(state: dict[str, torch.Tensor], path: str | os.PathLike) -> Path:
    """Write weights as safetensors atomically (temp file, fsync, rename, directory fsync)."""
    with atomic_path(path) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in strip_module_prefix(state).items()}, str(tmp))
    return Path(path)


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read weights from a safetensors/torch file or a checkpoint directory."""
    path = Path(path)
    if path.is_dir():
        path = resolve(path) / WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"no weights at {path}")
    if path.suffix == ".safetensors":
        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("model", state) if isinstance(state, dict) and "model" in state else state
    return strip_module_prefix(state)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
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


def commit_checkpoint(root: str | os.PathLike, step: int, *, weights: dict[str, torch.Tensor],
                      training_state: dict, files: Mapping[str, str | os.PathLike | bytes] | None = None,
                      keep: int = 2, meta: dict | None = None) -> Path:
    """Add weights, training state and ``files`` (name -> text, or a path to copy) to the staging
    directory, checksum everything, rename it into place as ``root/step-NNNNNNNN``, point
    ``root/latest`` at it and keep the newest ``keep`` (rank 0 only).  ``meta`` (small facts such as
    the world size) goes into the manifest, readable without loading anything else."""
    root = Path(root)
    tmp = staging_dir(root, step)
    if not tmp.is_dir():
        tmp = begin_checkpoint(root, step)
    final = root / f"step-{step:08d}"
    save_file({k: v.contiguous() for k, v in strip_module_prefix(weights).items()}, str(tmp / WEIGHTS))
    torch.save(training_state, tmp / STATE)
    for name, content in (files or {}).items():
        if isinstance(content, bytes):
            (tmp / name).write_bytes(content)
        elif isinstance(content, str):
            (tmp / name).write_text(content, encoding="utf-8")
        else:
            shutil.copyfile(content, tmp / name)
    # Strategy files (FSDP shards, DeepSpeed state) live in subdirectories: checksum them all.
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {"step": step, "meta": meta or {},
                "files": {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}}
    for p in files:
        _fsync_file(p)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    _fsync_file(tmp / MANIFEST)
    for directory in {p.parent for p in files} | {tmp}:
        _fsync_dir(directory)
    if final.exists():  # re-saving the same step (e.g. epoch end == max_steps): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _point_latest(root, final.name)
    _fsync_dir(root)
    # Only checkpoints older than this one are pruned: newer ones (from before a resume at an earlier
    # step) are another timeline the user may still want, and the one just written always stays.
    older = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name < final.name)
    for old in older[:max(0, len(older) - (keep - 1))]:
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
    """A checkpoint directory from a step directory, ``.../latest`` or a run's ``checkpoints`` folder."""
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
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} has {file.stat().st_size} bytes, "
                                  f"the manifest says {expected['size']} (truncated?)")
        if _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} does not match its checksum")
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
    except CheckpointError as e:  # e.g. `latest` dangling: fall back on the step directories themselves
        folder = given.parent if given.name == "latest" else given / "checkpoints" if (given / "checkpoints").is_dir() \
            else given
        steps = sorted((p for p in folder.glob("step-*") if p.is_dir()), reverse=True)
        if not steps or strict:
            raise
        warnings.append(f"{e}; trying the checkpoints in {folder}")
        newest = steps[0]
    # Only older ones: a newer step directory belongs to another timeline (see commit_checkpoint).
    candidates = [newest] + sorted((p for p in folder.glob("step-*") if p.is_dir() and p.name < newest.name),
                                   reverse=True)
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
    """The facts a checkpoint's manifest records (world size, strategy), without verifying or loading it."""
    return _read_manifest(resolve(path)).get("meta", {})


@dataclass
class Checkpoint:
    path: Path
    weights: dict[str, torch.Tensor]
    config: dict
    model_spec: dict
    label_names: list[str]
    tokenizer_json: str | None = None
    """The tokenizer, serialised (text tasks)."""

    @property
    def max_length(self) -> int:
        return self.config["data"]["max_length"]

    def training_state(self) -> dict:
        if not (self.path / STATE).is_file():
            raise CheckpointError(f"{self.path} holds weights only (an export), no training state to resume")
        return torch.load(self.path / STATE, map_location="cpu", weights_only=False)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """A checkpoint directory (verified against its manifest) or an exported ``.safetensors`` file."""
    if Path(path).is_file():
        return load_export(path)
    path = resolve(path)
    verify(path)

    def read(name: str, default):
        file = path / name
        return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else default

    tokenizer = path / TOKENIZER
    return Checkpoint(path, read_weights(path / WEIGHTS), read(CONFIG, {}), read(MODEL_SPEC, {}), read(LABELS, []),
                      tokenizer.read_text(encoding="utf-8") if tokenizer.is_file() else None)


def export(checkpoint: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write a checkpoint's full weights as one plain safetensors file, whatever strategy trained them.

    The architecture, labels, tokenizer and max length travel in the file's metadata, so
    ``rankwise predict --checkpoint model.safetensors`` and ``model.init_weights`` need nothing else.
    """
    source = load_checkpoint(checkpoint)
    metadata = {"format": "rankwise-export", "model_spec": json.dumps(source.model_spec, ensure_ascii=False),
                "label_names": json.dumps(source.label_names, ensure_ascii=False),
                "max_length": str(source.max_length)}
    if source.tokenizer_json is not None:
        metadata["tokenizer"] = source.tokenizer_json
    with atomic_path(out) as tmp:
        save_file({k: v.contiguous() for k, v in source.weights.items()}, str(tmp), metadata=metadata)
    return Path(out)


def load_export(path: str | os.PathLike) -> Checkpoint:
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for a bad header
        raise CheckpointError(f"{path} is not a readable safetensors file: {e}") from None
    if metadata.get("format") != "rankwise-export":
        raise CheckpointError(f"{path} has no rankwise metadata; export it with `rankwise export`")
    return Checkpoint(path, read_weights(path), {"data": {"max_length": int(metadata["max_length"])}},
                      json.loads(metadata["model_spec"]), json.loads(metadata["label_names"]),
                      metadata.get("tokenizer"))
