"""Text batches padded to a few shapes for a compiled model (``data.pad_to_multiple_of``)."""

from __future__ import annotations

import torch

from rankwise.data.datasets import TokenizedTextDataset


def _widths(dataset: TokenizedTextDataset, lengths: list[int]) -> tuple[int, int]:
    batch = dataset.collate([dataset[i] for i in range(len(lengths))])
    return batch["input_ids"].shape[1], batch["ngram_ids"].shape[1]


def test_a_batch_pads_to_a_multiple_its_ngrams_to_a_power_of_two_and_never_past_the_limit():
    lengths = [5, 17, 30]
    ids = [[7] * n for n in lengths]
    ngrams = (torch.arange(1, 1 + 3 * sum(lengths)), torch.tensor([0, 15, 66, 156]))
    plain = TokenizedTextDataset(ids, [0, 1, 0], pad_id=0, ngrams=ngrams)
    assert _widths(plain, lengths) == (30, 90)  # the longest text, the most n-grams
    bucketed = TokenizedTextDataset(ids, [0, 1, 0], 0, ngrams, pad_multiple=16, pad_limit=40)
    assert _widths(bucketed, lengths) == (32, 128)
    batch = bucketed.collate([bucketed[i] for i in range(3)])
    # padding is masked and counts no token
    assert batch["attention_mask"].sum().item() == sum(lengths)
    assert (batch["input_ids"][batch["attention_mask"] == 0] == 0).all()
    # rounded up to 32 but the model has 31 positions: the longest text's 30, then 31
    limited = TokenizedTextDataset(ids, [0, 1, 0], 0, ngrams, pad_multiple=16, pad_limit=31)
    assert _widths(limited, lengths)[0] == 31
    assert _widths(limited, [5])[0] == 16
