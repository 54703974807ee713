"""What a batch is made of, sample by sample: how many rows it has, one digest per sample (padding
left out), the tokens a loss averages over.  The Runtime's sharding check and the tools' probes
describe batches the same way."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

PADDING = (0, -100)
"""Values trimmed from the end of a sample without an attention mask (pad id 0, ignored label
-100)."""


def batch_tensors(batch) -> list[torch.Tensor]:
    """The tensors of ``batch`` (nested in mappings, lists and tuples), in order."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for value in batch.values() for t in batch_tensors(value)]
    if isinstance(batch, (list, tuple)):
        return [t for value in batch for t in batch_tensors(value)]
    return []


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _row_bytes(row: torch.Tensor, keep: torch.Tensor | None) -> bytes:
    if keep is not None:
        row = row[keep]
    elif row.dim() and row.dtype in (torch.int64, torch.int32, torch.int16):
        padding = torch.isin(row.reshape(-1), torch.tensor(PADDING, dtype=row.dtype))
        real = (~padding).nonzero()
        row = row.reshape(-1)[: int(real[-1]) + 1 if len(real) else 0]
    return _raw_bytes(row)


def batch_rows(batch) -> int:
    """Samples in a batch: the first dimension most of its tensors share (0 for a batch without
    tensors)."""
    firsts = [t.shape[0] for t in batch_tensors(batch) if t.dim() > 0]
    return max(set(firsts), key=firsts.count) if firsts else 0


def sample_digests(batch) -> list[str]:
    """One short digest per sample (row) of a batch: every tensor's row, padding left out."""
    tensors = [t.detach().cpu() for t in batch_tensors(batch) if t.dim() > 0]
    if not tensors:
        return []
    firsts = [t.shape[0] for t in tensors]
    rows = max(set(firsts), key=firsts.count)  # the batch dimension: the one most tensors share
    tensors = [t for t in tensors if t.shape[0] == rows]
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    mask = (
        mask.detach().cpu().bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
    )
    digests = []
    for i in range(rows):
        digest = hashlib.blake2b(digest_size=8)
        for t in tensors:
            keep = mask[i] if mask is not None and t.shape[:2] == mask.shape else None
            digest.update(str(t.dtype).encode() + _row_bytes(t[i], keep))
        digests.append(digest.hexdigest())
    return digests


def token_count(batch) -> int | None:
    """Tokens a loss averages over, where the batch says it: labels not -100, else the attention
    mask."""
    if not isinstance(batch, Mapping):
        return None
    labels, mask = batch.get("labels"), batch.get("attention_mask")
    if isinstance(labels, torch.Tensor) and labels.dim() > 1 and bool((labels == -100).any()):
        return int((labels != -100).sum())
    if isinstance(mask, torch.Tensor):
        return int(mask.sum())
    return None
