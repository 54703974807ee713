import subprocess
import sys

import pytest

from rankwise.data.tokenizer import TextEncoder

TEXTS = ["质量很好，非常满意", "质量太差了", "物流很快，质量很好", "非常满意的一次购物"] * 5


def test_char_tokenizer_one_token_per_character():
    enc = TextEncoder.build("char", TEXTS, 1000, 32)
    ids = enc.encode(["质量很好"])[0]
    assert len(ids) == 4 + 2  # [CLS] 质 量 很 好 [SEP]
    assert (
        enc.tokenizer.id_to_token(ids[0]) == "[CLS]"
        and enc.tokenizer.id_to_token(ids[-1]) == "[SEP]"
    )


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
    assert TextEncoder.build(str(tmp_path / "tokenizer.json"), [], 0, 16).encode(
        TEXTS[:1]
    ) == enc.encode(TEXTS[:1])


_TRAIN_IN_A_FRESH_PROCESS = """
import sys
from rankwise.data.sentiment import load_sentiment
from rankwise.data.tokenizer import TextEncoder
texts = sorted({r.text for r in load_sentiment()})[:4000]
print(TextEncoder.build(sys.argv[1], texts, 3000, 64).tokenizer.to_str())
"""


@pytest.mark.multiproc
@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_learned_tokenizers_are_identical_run_after_run(kind):
    """HF's trainers cut the alphabet and number WordPiece continuation pieces in hash-map order,
    which changes from process to process; rankwise fixes both, so two fresh processes learn the
    same file."""
    runs = [
        subprocess.run(
            [sys.executable, "-c", _TRAIN_IN_A_FRESH_PROCESS, kind],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        for _ in range(3)
    ]
    assert len(runs[0]) > 10_000 and runs[0] == runs[1] == runs[2]
