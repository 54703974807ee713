"""Deterministic splitting and cleaning of labelled texts.

A text's split is a function of the text alone (a SHA-256 bucket), so the same text can
never land in two splits, a split never changes when rows are added or reordered, and
every process and machine computes the same split without talking to the others.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable

from rankwise.data.records import Record

SPLITS = ("train", "dev", "test")


def hash_bucket(text: str, buckets: int = 100) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % buckets


def hash_split(text: str, dev_percent: int, test_percent: int) -> str:
    bucket = hash_bucket(text)
    if bucket >= 100 - test_percent:
        return "test"
    if bucket >= 100 - test_percent - dev_percent:
        return "dev"
    return "train"


def _labels_by_text(records: Iterable[Record]) -> dict[str, set[str]]:
    labels: dict[str, set[str]] = defaultdict(set)
    for record in records:
        labels[record.text].add(record.label)
    return labels


def _first_and_repeated(records: list[Record]) -> tuple[list[Record], list[Record]]:
    """The first row of each (text, label) pair, and the rows that repeat an earlier one."""
    seen: set[tuple[str, str]] = set()
    first: list[Record] = []
    repeated: list[Record] = []
    for record in records:
        key = (record.text, record.label)
        (repeated if key in seen else first).append(record)
        seen.add(key)
    return first, repeated


def clean(records: list[Record]) -> tuple[list[Record], dict[str, int]]:
    """Drop exact duplicate (text, label) pairs and every text seen with more than one label."""
    contradictory = {text for text, labels in _labels_by_text(records).items() if len(labels) > 1}
    first, _ = _first_and_repeated(records)
    kept = [record for record in first if record.text not in contradictory]
    stats = {
        "rows": len(records),
        "duplicates_removed": len(records)
        - len(kept)
        - sum(1 for r in records if r.text in contradictory),
        "contradictory_texts_removed": len(contradictory),
        "kept": len(kept),
    }
    return kept, stats


def assign_splits(
    records: list[Record], dev_percent: int, test_percent: int
) -> dict[str, list[Record]]:
    splits: dict[str, list[Record]] = {name: [] for name in SPLITS}
    for record in records:
        name = record.split or hash_split(record.text, dev_percent, test_percent)
        splits[name].append(record)
    return splits


def _example(text: str, width: int = 30) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")


def audit(splits: dict[str, list[Record]], examples: int = 3) -> list[str]:
    """Warnings about a split the user gave and rankwise keeps as given: rows repeated inside a
    split, texts seen with several labels, and texts of dev/test that also occur in train (leakage);
    each with its count and a few examples."""
    warnings = []
    labels_of = _labels_by_text(record for part in splits.values() for record in part)
    for name, part in splits.items():
        _, repeats = _first_and_repeated(part)
        if repeats:
            shown = ", ".join(f"{_example(r.text)} ({r.source})" for r in repeats[:examples])
            warnings.append(
                f"{len(repeats)} rows of the {name} split repeat an earlier row of it, e.g. {shown}"
            )
    contradictory = sorted(text for text, labels in labels_of.items() if len(labels) > 1)
    if contradictory:
        shown = ", ".join(
            f"{_example(t)}: {'/'.join(sorted(labels_of[t]))}" for t in contradictory[:examples]
        )
        warnings.append(f"{len(contradictory)} texts occur with more than one label, e.g. {shown}")
    train_texts = {r.text for r in splits.get("train", [])}
    for name in ("dev", "test"):
        leaked = sorted({r.text for r in splits.get(name, []) if r.text in train_texts})
        if leaked:
            shown = ", ".join(_example(t) for t in leaked[:examples])
            warnings.append(
                f"{len(leaked)} texts of the {name} split also occur in the training split "
                f"(train/{name} leakage), e.g. {shown}"
            )
    return warnings
