"""What a ``rankwise train`` checkpoint holds beyond the training state, and the files made from it.

A checkpoint of the built-in task also carries the run configuration, how to rebuild the
model, the label names and the tokenizer, so ``rankwise predict`` and ``rankwise export``
need nothing else; an export is one safetensors file with the same facts in its metadata.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from rankwise.checkpoint import STATE, WEIGHTS, atomic_path, loading, read_weights, resolve, verify
from rankwise.checkpoint.atomic_files import save_weights_file
from rankwise.errors import CheckpointError

CONFIG = "config.json"
MODEL_SPEC = "model_spec.json"
LABELS = "labels.json"
TOKENIZER = "tokenizer.json"


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
            raise CheckpointError(
                f"{self.path} holds weights only (an export), no training state to resume"
            )
        return loading.load(self.path / STATE, "training-state")


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """A checkpoint directory (verified against its manifest) or an exported ``.safetensors``
    file."""
    if Path(path).is_file():
        return load_export(path)
    path = resolve(path)
    verify(path)

    def read(name: str, default):
        file = path / name
        return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else default

    tokenizer = path / TOKENIZER
    return Checkpoint(
        path,
        read_weights(path / WEIGHTS),
        read(CONFIG, {}),
        read(MODEL_SPEC, {}),
        read(LABELS, []),
        tokenizer.read_text(encoding="utf-8") if tokenizer.is_file() else None,
    )


def export(checkpoint: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write a checkpoint's full weights as one plain safetensors file, whatever strategy trained
    them.

    The architecture, labels, tokenizer and max length travel in the file's metadata, so ``rankwise
    predict --checkpoint model.safetensors`` and ``model.init_weights`` need nothing else.
    """
    source = load_checkpoint(checkpoint)
    metadata = {
        "format": "rankwise-export",
        "model_spec": json.dumps(source.model_spec, ensure_ascii=False),
        "label_names": json.dumps(source.label_names, ensure_ascii=False),
        "max_length": str(source.max_length),
    }
    if source.tokenizer_json is not None:
        metadata["tokenizer"] = source.tokenizer_json
    with atomic_path(out) as tmp:
        save_weights_file(source.weights, tmp, metadata)
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
    return Checkpoint(
        path,
        read_weights(path),
        {"data": {"max_length": int(metadata["max_length"])}},
        json.loads(metadata["model_spec"]),
        json.loads(metadata["label_names"]),
        metadata.get("tokenizer"),
    )
