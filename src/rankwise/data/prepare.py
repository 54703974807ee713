"""Turn ``data.*`` config into train/dev/test datasets, once, before workers start.

The launching process reads and validates the data (so bad files fail before any
worker is spawned), learns the tokenizer on the training split, encodes every split and
saves the result under ``<run>/data/``.  Workers only load that file, so every rank
trains on exactly the same token ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rankwise.checkpoint import atomic_path, loading, write_text_atomic
from rankwise.data.datasets import FeatureDataset, TokenizedTextDataset
from rankwise.data.ngrams import CharNgrams
from rankwise.data.records import DataError, Record
from rankwise.data.sentiment import load_sentiment
from rankwise.data.split import SPLITS, assign_splits, audit, clean, hash_bucket, hash_split
from rankwise.data.tokenizer import TextEncoder
from rankwise.data.toy import make_toy
from rankwise.data.user_files import read_file
from rankwise.train.config import DataConfig

PREPARED_FILE, STATS_FILE, TOKENIZER_FILE = "prepared.pt", "stats.json", "tokenizer.json"


def _feed(hasher, value) -> None:
    """Hash tensors by their bytes and shape, lists of numbers as JSON (token ids are lists of
    ints)."""
    if isinstance(value, torch.Tensor):
        hasher.update(str(tuple(value.shape)).encode())
        hasher.update(value.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        for item in value:
            _feed(hasher, item)
    else:
        hasher.update(json.dumps(value).encode())


@dataclass
class PreparedData:
    kind: str
    """``text`` or ``features``."""
    label_names: list[str]
    splits: dict[str, dict]
    """split -> {"ids"/"features": ..., "labels": ...}."""
    stats: dict = field(default_factory=dict)
    encoder: TextEncoder | None = None
    features: int | None = None
    ngrams: CharNgrams | None = None
    """How the splits' character n-grams were hashed (``None``: tokens only)."""
    digests: dict[str, str] = field(default_factory=dict)
    """Each split's :meth:`digest` once computed; saved with the data, so the workers read the
    launcher's."""
    origin: Path | None = field(default=None, compare=False, repr=False)
    """The directory it was loaded from (a cache entry): :meth:`save` copies that directory's
    files."""

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def size(self, split: str) -> int:
        return len(self.splits[split]["labels"])

    def dataset(
        self, split: str, ngrams: bool = False, pad_multiple: int = 1, pad_limit: int | None = None
    ):
        """The split as a torch dataset; ``ngrams`` adds each text's character n-grams to its
        batches; a text's batches are padded to a multiple of ``pad_multiple`` tokens, never past
        ``pad_limit``."""
        part = self.splits[split]
        if self.kind == "features":
            return FeatureDataset(part["features"], part["labels"])
        if ngrams and self.ngrams is None:
            raise ValueError(
                "the model reads character n-grams but the data has none (data.char_ngrams=0)"
            )
        assert self.encoder is not None  # text data (not features) is tokenized: it has an encoder
        return TokenizedTextDataset(
            part["ids"],
            part["labels"],
            self.encoder.pad_id,
            part["ngrams"] if ngrams else None,
            pad_multiple,
            pad_limit,
        )

    def digest(self, split: str) -> str:
        """A fingerprint of a split as the workers read it (token ids or features, labels, label
        names): it changes with the data file, the tokenizer or the cleaning."""
        if split not in self.digests:
            hasher = hashlib.sha256(json.dumps(self.label_names, ensure_ascii=False).encode())
            for key, value in sorted(self.splits[split].items()):
                hasher.update(key.encode())
                _feed(hasher, value)
            self.digests[split] = hasher.hexdigest()[:16]
        return self.digests[split]

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        names = (
            (TOKENIZER_FILE, PREPARED_FILE, STATS_FILE)
            if self.encoder is not None
            else (PREPARED_FILE, STATS_FILE)
        )
        if self.origin is not None and all((self.origin / name).is_file() for name in names):
            # Loaded from a cache entry: the same bytes, copied (serialising the token ids again
            # took a second of every cached run's start on the default job).
            try:
                for name in names:
                    with atomic_path(directory / name) as tmp:
                        shutil.copyfile(self.origin / name, tmp)
                return directory
            except FileNotFoundError:  # the entry was being replaced: write it out here instead
                pass
        if self.encoder is not None:
            self.encoder.save(directory)
        payload = {
            "kind": self.kind,
            "label_names": self.label_names,
            "splits": self.splits,
            "stats": self.stats,
            "features": self.features,
            "max_length": self.encoder.max_length if self.encoder else None,
            "ngrams": self.ngrams.to_dict() if self.ngrams else None,
            # hashed here once, not again in every rank
            "digests": {"train": self.digest("train")},
        }
        # nodes sharing one --out write it at once
        with atomic_path(directory / PREPARED_FILE) as tmp:
            torch.save(payload, tmp)
        write_text_atomic(
            directory / STATS_FILE, json.dumps(self.stats, indent=2, ensure_ascii=False)
        )
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> PreparedData:
        directory = Path(directory)
        payload = loading.load(directory / PREPARED_FILE, "prepared-data")
        encoder = (
            TextEncoder.load(directory, payload["max_length"])
            if payload["kind"] == "text"
            else None
        )
        return cls(
            payload["kind"],
            payload["label_names"],
            payload["splits"],
            payload["stats"],
            encoder,
            payload["features"],
            CharNgrams.from_dict(payload.get("ngrams")),
            payload.get("digests", {}),
            origin=directory,
        )


def load_records(config: DataConfig) -> list[Record]:
    if config.source == "sentiment":
        return load_sentiment()
    return read_file(config.source, config.text_column, config.label_column, config.split_column)


def prepare_text(config: DataConfig) -> PreparedData:
    records = load_records(config)
    given_split = any(r.split for r in records)
    drop = config.drop_duplicates if config.drop_duplicates is not None else not given_split
    stats: dict[str, Any]  # counts, then the audit's warnings
    if drop:
        records, counts = clean(records)
        stats = {**counts}
    else:  # the user's split, exactly as given
        stats = {
            "rows": len(records),
            "duplicates_removed": 0,
            "contradictory_texts_removed": 0,
            "kept": len(records),
        }
    splits = assign_splits(records, config.dev_percent, config.test_percent)
    stats["warnings"] = [] if drop else audit(splits)
    if config.limit:
        # A hash order, not file order: a limited slice still mixes every label.
        splits = {
            name: sorted(part, key=lambda r: hash_bucket(r.text, 2**32))[: config.limit]
            for name, part in splits.items()
        }
    if not splits["train"]:
        raise DataError(config.source, "the training split is empty")
    if not splits["test"]:
        raise DataError(
            config.source, "the test split is empty; add rows or raise data.test_percent"
        )
    label_names = sorted({r.label for r in splits["train"]})
    if len(label_names) < 2:
        raise DataError(
            config.source, f"the training split has a single label {label_names}; need at least 2"
        )
    label_id = {name: i for i, name in enumerate(label_names)}
    for name in ("dev", "test"):
        for record in splits[name]:
            if record.label not in label_id:
                raise DataError(
                    record.source.rsplit(":", 1)[0],
                    f"label {record.label!r} of the {name} split never occurs in the training "
                    f"split ({', '.join(label_names)})",
                    int(record.source.rsplit(":", 1)[1]),
                )
    encoder = TextEncoder.build(
        config.tokenizer, [r.text for r in splits["train"]], config.vocab_size, config.max_length
    )
    encoded = {
        name: {
            "ids": encoder.encode([r.text for r in part]),
            "labels": [label_id[r.label] for r in part],
        }
        for name, part in splits.items()
    }
    ngrams = CharNgrams(config.char_ngrams, config.ngram_buckets) if config.char_ngrams else None
    if ngrams:
        for name, part in splits.items():
            encoded[name]["ngrams"] = ngrams.encode([r.text for r in part])
    stats |= {f"{name}_samples": len(part) for name, part in splits.items()}
    stats["vocab_size"] = encoder.vocab_size
    return PreparedData("text", label_names, encoded, stats, encoder, ngrams=ngrams)


def prepare_toy(config: DataConfig, seed: int) -> PreparedData:
    x, y = make_toy(config.toy_samples, config.toy_features, config.toy_classes, seed=seed)
    names = [hash_split(f"toy-{i}", config.dev_percent, config.test_percent) for i in range(len(y))]
    splits = {}
    for split in SPLITS:
        rows = torch.tensor([i for i, name in enumerate(names) if name == split], dtype=torch.long)
        if config.limit:
            rows = rows[: config.limit]
        splits[split] = {"features": x[rows], "labels": y[rows]}
    stats = {f"{split}_samples": len(part["labels"]) for split, part in splits.items()}
    return PreparedData(
        "features",
        [str(c) for c in range(config.toy_classes)],
        splits,
        stats,
        features=config.toy_features,
    )


def prepare_data(config: DataConfig, seed: int = 1234) -> PreparedData:
    """The prepared splits; from ``config.cache_dir`` when an earlier run prepared the same data."""
    entry = cache_entry(config, seed)
    if entry is None:
        return _prepare(config, seed)
    if (entry / PREPARED_FILE).is_file():
        try:
            return PreparedData.load(entry)
        except Exception:  # noqa: BLE001 - an unreadable entry is prepared again, never trusted
            pass
    data = _prepare(config, seed)
    staging = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    data.save(staging)
    shutil.rmtree(entry, ignore_errors=True)
    os.replace(staging, entry)  # whole entries only: a concurrent reader never sees half of one
    return data


def cache_entry(config: DataConfig, seed: int = 1234) -> Path | None:
    """Where ``prepare_data`` keeps (or finds) this data in ``config.cache_dir``; None without a
    cache."""
    return Path(config.cache_dir) / _cache_key(config, seed) if config.cache_dir else None


def _cache_key(config: DataConfig, seed: int) -> str:
    """Hash of the data settings and of the source file's identity (size, modification time)."""
    settings = config.model_dump(exclude={"cache_dir"})
    source = Path(config.source)
    if source.is_file():
        stat = source.stat()
        settings["source_file"] = [str(source.resolve()), stat.st_size, stat.st_mtime_ns]
    blob = json.dumps(
        {"settings": settings, "seed": seed, "format": 1}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _prepare(config: DataConfig, seed: int) -> PreparedData:
    if config.source == "toy":
        return prepare_toy(config, seed)
    return prepare_text(config)
