"""Tokenizers: learned from the training split with HF ``tokenizers``, or a local HF tokenizer.

* ``char``: one token per character (NFKC-normalised, lower-cased).
* ``bpe`` (default): a byte-pair vocabulary learned on the training texts.  Runs of CJK
  characters are *not* split into single characters first, so frequent words and
  phrases (质量, 不错, 我觉得) become single tokens, with single characters as fallback;
  reviews get ~37% shorter than character level.
* ``wordpiece``: the same idea with WordPiece (``##`` continuation pieces).
* a local path: any tokenizer ``transformers.AutoTokenizer`` loads offline.

The tokenizer is saved next to the prepared data and inside every checkpoint, so
``rankwise predict`` encodes text exactly as training did.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from rankwise.checkpoint import atomic_path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _normalizer():
    return normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip()])


def _finish(tokenizer: Tokenizer, max_length: int) -> Tokenizer:
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    return tokenizer


def _word_pre_tokenizer():
    # Split on whitespace and punctuation only: CJK runs stay whole so merges can form words.
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Punctuation(),
            pre_tokenizers.Digits(individual_digits=False),
        ]
    )


# Cap the single-character alphabet: without it, the thousands of rare CJK characters
# alone fill the vocabulary and nothing is left for multi-character tokens.
ALPHABET_LIMIT = 2500


def fixed_alphabet(texts: list[str], limit: int = ALPHABET_LIMIT) -> list[str]:
    """The ``limit`` most frequent characters of the normalised texts, ties broken by the character.

    HF's trainers cut their alphabet at ``limit_alphabet`` among characters of equal count in
    hash-map order, which differs from run to run (measured: 18 of 6,000 vocabulary entries and
    2,097 ids changed between two identical runs).  Given exactly this alphabet as
    ``initial_alphabet``, the trainer keeps it whole and numbers it in sorted order, and the
    merges that follow are the same every run.
    """
    normalizer = _normalizer()
    counts = Counter(
        char for text in texts for char in normalizer.normalize_str(text) if not char.isspace()
    )
    return [
        char for char, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]
    ]


def train_bpe_tokenizer(texts: list[str], vocab_size: int, max_length: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.normalizer = _normalizer()
    tokenizer.pre_tokenizer = _word_pre_tokenizer()
    tokenizer.decoder = decoders.BPEDecoder()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        limit_alphabet=ALPHABET_LIMIT,
        initial_alphabet=fixed_alphabet(texts),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return _finish(tokenizer, max_length)


def train_char_tokenizer(texts: list[str], vocab_size: int, max_length: int) -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.normalizer = _normalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex("."), behavior="isolated"),
        ]
    )
    trainer = trainers.WordLevelTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    return _finish(tokenizer, max_length)


def _wordpiece_tokenizer(vocab: dict[str, int] | None = None) -> Tokenizer:
    model = (
        models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=200)
        if vocab
        else models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=200)
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = _normalizer()
    tokenizer.pre_tokenizer = _word_pre_tokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def train_wordpiece_tokenizer(texts: list[str], vocab_size: int, max_length: int) -> Tokenizer:
    alphabet = fixed_alphabet(texts)
    # Every known character must also exist as a continuation piece ("##质"), or a word whose only
    # unseen piece is such a character would encode as one [UNK].  Given to the trainer up front
    # (as reserved tokens), they get fixed ids: HF's trainer otherwise numbers continuation pieces
    # in hash-map order, different every run, and breaks ties between merges by those ids.
    continuations = [f"##{char}" for char in alphabet]
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size + len(continuations),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS + continuations,
        limit_alphabet=ALPHABET_LIMIT,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    trained = _wordpiece_tokenizer()
    trained.train_from_iterator(texts, trainer)
    # A fresh tokenizer over the learned vocabulary: the continuation pieces are ordinary tokens.
    tokenizer = _wordpiece_tokenizer(trained.get_vocab())
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return _finish(tokenizer, max_length)


class TextEncoder:
    """Text -> token ids, with the padding id and vocabulary size the model needs.

    Texts longer than ``max_length`` keep their head and their tail (``[CLS]`` and
    ``[SEP]`` included): reviews often state the verdict at the end.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()

    @classmethod
    def build(
        cls, kind: str, train_texts: list[str], vocab_size: int, max_length: int
    ) -> TextEncoder:
        if kind == "char":
            return cls(train_char_tokenizer(train_texts, vocab_size, max_length), max_length)
        if kind == "wordpiece":
            return cls(train_wordpiece_tokenizer(train_texts, vocab_size, max_length), max_length)
        if kind == "bpe":
            return cls(train_bpe_tokenizer(train_texts, vocab_size, max_length), max_length)
        return cls.from_pretrained(kind, max_length)

    @classmethod
    def from_pretrained(cls, path: str, max_length: int) -> TextEncoder:
        """A local HF tokenizer (directory or tokenizer.json); never downloads."""
        location = Path(path)
        if location.is_file():
            return cls(Tokenizer.from_file(str(location)), max_length)
        if not location.is_dir():
            raise ValueError(
                f"data.tokenizer={path!r}: expected bpe, wordpiece, char or a local tokenizer path"
            )
        if (location / "tokenizer.json").is_file():
            return cls(Tokenizer.from_file(str(location / "tokenizer.json")), max_length)
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(location), local_files_only=True, use_fast=True)
        if not getattr(hf, "is_fast", False):
            raise ValueError(
                f"data.tokenizer={path!r}: only fast (tokenizers-backed) tokenizers are supported"
            )
        return cls(hf.backend_tokenizer, max_length)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        for token in ("[PAD]", "<pad>"):
            token_id = self.tokenizer.token_to_id(token)
            if token_id is not None:
                return token_id
        return 0

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [
            self._head_and_tail(encoding.ids) for encoding in self.tokenizer.encode_batch(texts)
        ]

    def _head_and_tail(self, ids: list[int]) -> list[int]:
        if len(ids) <= self.max_length:
            return ids
        head = self.max_length // 2
        return ids[:head] + ids[len(ids) - (self.max_length - head) :]

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "tokenizer.json"
        # another node's workers may be reading it (one shared --out)
        with atomic_path(path) as tmp:
            self.tokenizer.save(str(tmp))
        return path

    @classmethod
    def load(cls, directory: str | Path, max_length: int) -> TextEncoder:
        return cls(Tokenizer.from_file(str(Path(directory) / "tokenizer.json")), max_length)
