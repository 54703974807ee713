import zlib

import pytest
import torch

from rankwise.data.ngrams import PAD, CharNgrams
from rankwise.data.prepare import prepare_data
from rankwise.train.config import DataConfig


def test_every_substring_up_to_n_characters_hashes_stably():
    grams = CharNgrams(n=3, buckets=1000)
    ids = grams.ids("质量差")
    assert len(ids) == 3 + 2 + 1
    # CRC-32 of the UTF-32 bytes: the same id in every process, run and machine (unlike hash()).
    assert ids[-1] == 1 + zlib.crc32("质量差".encode("utf-32-le")) % 999
    assert all(PAD < i < 1000 for i in ids)
    assert grams.ids("质量差") == ids and grams.ids("") == []
    assert CharNgrams(n=1, buckets=1000).ids("质量差") == ids[:3]


def test_flat_encoding_and_offsets_round_trip():
    grams = CharNgrams(n=2, buckets=50)
    flat, offsets = grams.encode(["ab", "", "xyz"])
    assert offsets.tolist() == [0, 3, 3, 8]
    assert flat[offsets[2] : offsets[3]].tolist() == grams.ids("xyz")
    assert CharNgrams.from_dict(grams.to_dict()) == grams and CharNgrams.from_dict(None) is None


def test_prepared_batches_carry_padded_ngram_rows(tmp_path):
    data = prepare_data(DataConfig(source="sentiment", limit=40, max_length=16))
    assert data.ngrams == CharNgrams(3, 2**18)
    dataset = data.dataset("train", ngrams=True)
    batch = dataset.collate([dataset[i] for i in range(4)])
    texts_lengths = [(batch["ngram_ids"][row] != PAD).sum().item() for row in range(4)]
    flat, offsets = data.splits["train"]["ngrams"]
    assert texts_lengths == [(offsets[i + 1] - offsets[i]).item() for i in range(4)]
    # tokens only unless asked
    assert "ngram_ids" not in data.dataset("train").collate([dataset[0]])

    data.save(tmp_path)
    from rankwise.data.prepare import PreparedData

    assert PreparedData.load(tmp_path).ngrams == data.ngrams
    plain = prepare_data(DataConfig(source="sentiment", limit=40, max_length=16, char_ngrams=0))
    assert plain.ngrams is None and "ngrams" not in plain.splits["train"]
    with pytest.raises(ValueError, match="data.char_ngrams=0"):
        plain.dataset("train", ngrams=True)
    first_ids = [torch.as_tensor(d.splits["train"]["ids"][0]) for d in (plain, data)]
    assert torch.equal(*first_ids)
