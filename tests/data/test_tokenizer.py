from rankwise.data.tokenizer import TextEncoder

TEXTS = ["质量很好，非常满意", "质量太差了", "物流很快，质量很好", "非常满意的一次购物"] * 5


def test_char_tokenizer_one_token_per_character():
    enc = TextEncoder.build("char", TEXTS, 1000, 32)
    ids = enc.encode(["质量很好"])[0]
    assert len(ids) == 4 + 2  # [CLS] 质 量 很 好 [SEP]
    assert enc.tokenizer.id_to_token(ids[0]) == "[CLS]" and enc.tokenizer.id_to_token(ids[-1]) == "[SEP]"


def test_wordpiece_learns_multi_character_tokens_and_truncates():
    enc = TextEncoder.build("wordpiece", TEXTS, 300, 8)
    tokens = enc.tokenizer.encode("质量很好").tokens
    assert any(len(t.replace("##", "")) > 1 for t in tokens[1:-1]), tokens
    assert len(enc.encode(["质量很好" * 20])[0]) == 8
    assert enc.pad_id == enc.tokenizer.token_to_id("[PAD]")


def test_save_and_load_reproduce_ids(tmp_path):
    enc = TextEncoder.build("wordpiece", TEXTS, 300, 16)
    enc.save(tmp_path)
    again = TextEncoder.load(tmp_path, 16)
    assert again.encode(TEXTS[:3]) == enc.encode(TEXTS[:3])
    # A local tokenizer path is accepted as data.tokenizer.
    assert TextEncoder.build(str(tmp_path / "tokenizer.json"), [], 0, 16).encode(TEXTS[:1]) == enc.encode(TEXTS[:1])
