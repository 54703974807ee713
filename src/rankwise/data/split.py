"""Deterministic splitting and cleaning of labelled texts.

A text's split is a function of the text alone (a SHA-256 bucket), so the same text can
never land in two splits, a split never changes when rows are added or reordered, and
every process and machine computes the same split without talking to the others.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

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


def clean(records: list[Record]) -> tuple[list[Record], dict[str, int]]:
    """Drop exact duplicate (text, label) pairs and every text seen with more than one label."""
    labels_of: dict[str, set[str]] = defaultdict(set)
    for record in records:
        labels_of[record.text].add(record.label)
    contradictory = {text for text, labels in labels_of.items() if len(labels) > 1}
    seen: set[tuple[str, str]] = set()
    kept = []
    for record in records:
        key = (record.text, record.label)
        if record.text in contradictory or key in seen:
            continue
        seen.add(key)
        kept.append(record)
    stats = {
        "rows": len(records),
        "duplicates_removed": len(records) - len(kept) - sum(1 for r in records if r.text in contradictory),
        "contradictory_texts_removed": len(contradictory),
        "kept": len(kept),
    }
    return kept, stats


def assign_splits(records: list[Record], dev_percent: int, test_percent: int) -> dict[str, list[Record]]:
    splits: dict[str, list[Record]] = {name: [] for name in SPLITS}
    for record in records:
        name = record.split or hash_split(record.text, dev_percent, test_percent)
        splits[name].append(record)
    return splits
