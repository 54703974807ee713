"""Hashed character n-grams of a whole text: the input of a BERT preset's bag-of-n-grams path.

Every substring of 1..n characters is hashed (CRC-32, the same in every process and on
every machine, unlike Python's ``hash``) into ``buckets`` ids; id 0 is reserved for padding.
The whole text is used, not the ``max_length`` tokens the transformer sees.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass

import torch

PAD = 0


@dataclass(frozen=True)
class CharNgrams:
    n: int
    """Longest n-gram, in characters (1..n are all used)."""
    buckets: int
    """Hash buckets, padding id 0 included."""

    def ids(self, text: str) -> list[int]:
        data = text.encode("utf-32-le")  # fixed 4 bytes per character: n characters = 4n bytes
        chars = len(text)
        return [
            PAD + 1 + zlib.crc32(data[4 * i : 4 * (i + size)]) % (self.buckets - 1)
            for size in range(1, self.n + 1)
            for i in range(chars - size + 1)
        ]

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """All texts' ids as one flat int32 tensor and the offset where each text's ids start (plus
        the end)."""
        per_text = [self.ids(text) for text in texts]
        offsets = torch.zeros(len(per_text) + 1, dtype=torch.long)
        offsets[1:] = torch.tensor([len(ids) for ids in per_text], dtype=torch.long).cumsum(0)
        flat = torch.tensor([i for ids in per_text for i in ids], dtype=torch.int32)
        return flat, offsets

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, settings: dict | None) -> CharNgrams | None:
        return cls(**settings) if settings else None
