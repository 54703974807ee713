"""Torch datasets for prepared splits; every sample carries its index for exact evaluation."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class TokenizedTextDataset(Dataset):
    """Token-id sequences of varying length and integer labels, optionally with each text's
    hashed character n-grams (``ngrams``: flat ids and per-text offsets, see ``data.ngrams``)."""

    def __init__(
        self,
        ids: list[list[int]],
        labels: list[int],
        pad_id: int = 0,
        ngrams: tuple[torch.Tensor, torch.Tensor] | None = None,
        pad_multiple: int = 1,
        pad_limit: int | None = None,
    ):
        if len(ids) != len(labels):
            raise ValueError(f"{len(ids)} texts but {len(labels)} labels")
        if ngrams is not None and len(ngrams[1]) != len(ids) + 1:
            raise ValueError(f"{len(ids)} texts but n-gram offsets for {len(ngrams[1]) - 1}")
        self.ids = ids
        self.labels = labels
        self.pad_id = pad_id
        self.ngrams = ngrams
        self.pad_multiple = pad_multiple
        """Batches are padded to a multiple of this many tokens (1: to the longest text), and
        their n-gram rows, where it is above 1, to a power of two: a few shapes for a compiled
        model (see ``data.pad_to_multiple_of``)."""
        self.pad_limit = pad_limit
        """Rounding up never pads past this many tokens (the model's positions: ``max_length``)."""

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return self.ids[i], self.labels[i], i

    @property
    def lengths(self) -> list[int]:
        """Tokens per sample, for batching texts of similar length together."""
        return [len(ids) for ids in self.ids]

    def collate(self, items) -> dict[str, torch.Tensor]:
        """Pad to the longest sequence of the batch (not to max_length: less work per step),
        rounded up to :attr:`pad_multiple`."""
        longest = max(len(ids) for ids, _, _ in items)
        rounded = _round_up(longest, self.pad_multiple)
        longest = max(longest, min(rounded, self.pad_limit or rounded))
        input_ids = torch.full((len(items), longest), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(items), longest), dtype=torch.long)
        for row, (ids, _, _) in enumerate(items):
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.ngrams is not None:
            batch["ngram_ids"] = self._ngram_batch([i for _, _, i in items])
        batch["labels"] = torch.tensor([label for _, label, _ in items], dtype=torch.long)
        batch["index"] = torch.tensor([i for _, _, i in items], dtype=torch.long)
        return batch

    def _ngram_batch(self, indices: list[int]) -> torch.Tensor:
        """Each text's n-gram ids in a row, padded with 0 (a (batch, n-grams) tensor splits by
        sample like every other input, also under DataParallel's scatter)."""
        assert self.ngrams is not None  # collate calls this only for a dataset with n-grams
        flat, offsets = self.ngrams
        rows = [flat[offsets[i] : offsets[i + 1]] for i in indices]
        width = max(1, max(len(r) for r in rows))
        if self.pad_multiple > 1:  # (n-gram counts spread widely: powers of two, a few shapes)
            width = max(self.pad_multiple, 1 << (width - 1).bit_length())
        out = torch.zeros((len(rows), width), dtype=torch.long)
        for row, ids in enumerate(rows):
            out[row, : len(ids)] = ids
        return out


class FeatureDataset(Dataset):
    """Dense feature vectors and integer labels (the ``toy`` task)."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor):
        self.features = features
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return {"features": self.features[i], "labels": self.labels[i], "index": torch.tensor(i)}

    collate = None  # the default collate stacks the dicts


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
