"""Message sizes for ``rankwise comm bench``: a size as the command takes it, the sweep's sizes,
and the elements a rank sends for one operation at one size."""

from __future__ import annotations

import argparse
import re

SPLIT_OPS = ("all_gather", "reduce_scatter", "all_to_all")
"""Operations whose buffer is split into one chunk per rank (their element count is rounded to a
multiple of n)."""


def parse_size(text: str) -> int:
    """``4``, ``64K``, ``256M``, ``1G`` (binary multiples; a trailing B or iB is allowed) as
    bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4, 64K, 256M, 1G)")
    return int(match.group(1)) * 1024 ** " KMG".index((match.group(2) or " ").upper())


def sizes_between(min_bytes: int, max_bytes: int) -> list[int]:
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def elements(op: str, size: int, n: int, itemsize: int) -> int:
    count = max(1, size // itemsize)
    if op in SPLIT_OPS:
        count = max(n, count - count % n)
    return count
