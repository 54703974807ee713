"""Torch datasets for prepared splits; every sample carries its index for exact evaluation."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class TokenizedTextDataset(Dataset):
    """Token-id sequences of varying length and integer labels."""

    def __init__(self, ids: list[list[int]], labels: list[int], pad_id: int = 0):
        if len(ids) != len(labels):
            raise ValueError(f"{len(ids)} texts but {len(labels)} labels")
        self.ids = ids
        self.labels = labels
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        return self.ids[i], self.labels[i], i

    @property
    def lengths(self) -> list[int]:
        """Tokens per sample, for batching texts of similar length together."""
        return [len(ids) for ids in self.ids]

    def collate(self, items) -> dict[str, torch.Tensor]:
        """Pad to the longest sequence of the batch (not to max_length): less work per step."""
        longest = max(len(ids) for ids, _, _ in items)
        input_ids = torch.full((len(items), longest), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(items), longest), dtype=torch.long)
        for row, (ids, _, _) in enumerate(items):
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": torch.tensor([label for _, label, _ in items], dtype=torch.long),
            "index": torch.tensor([i for _, _, i in items], dtype=torch.long),
        }


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
