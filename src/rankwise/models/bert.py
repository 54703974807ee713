"""BERT-style sequence classifiers from ``transformers``: size presets or a local pretrained
model."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

# Sizes for models trained from scratch.  tiny is ~1M parameters with a 6k vocabulary, base ~90M,
# large ~310M.
BERT_PRESETS: dict[str, dict] = {
    "tiny": dict(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512
    ),
    "small": dict(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    ),
    "base": dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    ),
    # ~310M parameters: where sharding (fsdp, deepspeed ZeRO-3) pays off against each process's
    # fixed footprint.
    "large": dict(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    ),
}
POOLINGS = ("cls", "mean")


class MeanPooledBert(nn.Module):
    """A BERT encoder whose classifier reads the mean of the non-padding token states.

    Trained from scratch on a few thousand short texts, the mean of all tokens is a
    steadier sentence summary than the single [CLS] state that BertForSequenceClassification
    passes through its pooler.
    """

    _no_split_modules = ["BertLayer"]  # FSDP shards each layer as its own unit

    def __init__(self, config):
        from transformers import BertModel

        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        nn.init.normal_(self.classifier.weight, std=config.initializer_range)
        nn.init.zeros_(self.classifier.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **inputs
    ) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        states = self.bert(
            input_ids=input_ids, attention_mask=attention_mask, **inputs
        ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.classifier(self.dropout(pooled))


# The bag-of-n-grams path's output is multiplied by this: under the shared AdamW learning rate
# its weights then move 10x faster than the transformer's (an Adam step moves each weight by
# about lr), which is what a linear model over sparse n-grams needs in a few epochs.
NGRAM_LR_SCALE = 10.0


class WideAndDeepBert(nn.Module):
    """A BERT classifier ("deep") whose logits are added to those of a linear classifier over
    the text's hashed character n-grams ("wide", a bag of n-grams).

    Trained from scratch on ~15k short reviews, the transformer alone stays at ~0.84
    accuracy and a linear n-gram model at ~0.85; trained jointly, each learns what the other
    misses.  The n-gram path reads the whole text, the transformer ``max_length`` tokens.
    """

    _no_split_modules = ["BertLayer"]  # FSDP shards each layer as its own unit

    def __init__(self, bert: nn.Module, buckets: int, num_labels: int):
        super().__init__()
        self.bert = bert
        self.ngrams = nn.Embedding(buckets, num_labels, padding_idx=0)
        nn.init.zeros_(self.ngrams.weight)  # starts as the plain transformer

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        ngram_ids: torch.Tensor | None = None,
        **inputs,
    ) -> torch.Tensor:
        if ngram_ids is None:
            raise ValueError("this model also reads character n-grams: the batch needs ngram_ids")
        deep = self.bert(input_ids=input_ids, attention_mask=attention_mask, **inputs)
        deep = getattr(deep, "logits", deep)
        # Sum of the n-grams' weights over sqrt(count): an L2-normalised bag of n-gram counts.
        count = (ngram_ids != 0).sum(dim=1, keepdim=True).clamp(min=1).to(deep.dtype)
        wide = self.ngrams(ngram_ids).sum(dim=1) * count.rsqrt() * NGRAM_LR_SCALE
        return deep + wide.to(deep.dtype)


# Dropout settings of the common encoder configs (BERT, RoBERTa, ALBERT, ELECTRA, MegatronBERT;
# DistilBERT).
DROPOUT_KEYS = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "dropout",
    "attention_dropout",
)


def build_bert(
    name: str,
    *,
    num_labels: int,
    dropout: float,
    vocab_size: int | None,
    pad_id: int,
    max_length: int,
    pooling: str = "cls",
    ngrams: dict | None = None,
) -> tuple[nn.Module, dict]:
    """A preset trained from scratch (with a bag-of-n-grams path when ``ngrams`` describes the
    data's character n-grams) or a local pretrained model (tokens only)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig

    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r}: choose one of {', '.join(POOLINGS)}")
    if name in BERT_PRESETS:
        if vocab_size is None:
            raise ValueError("a BERT preset needs the tokenizer's vocabulary size")
        # ignore[call-arg]: num_labels is PretrainedConfig's, passed on through BertConfig's
        # **kwargs
        config = BertConfig(
            vocab_size=vocab_size,
            max_position_embeddings=max_length,
            pad_token_id=pad_id,  # type: ignore[call-arg]
            num_labels=num_labels,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
            **BERT_PRESETS[name],
        )
        spec = {"kind": "hf", "config": config.to_dict(), "pooling": pooling, "ngrams": ngrams}
        return bert_from_spec(spec), spec
    if Path(name).is_dir():
        if pooling != "cls":
            raise ValueError(
                "a local pretrained model keeps its own classification head: use model.pooling=cls"
            )
        # A local pretrained model; never downloads (local_files_only).
        config = AutoConfig.from_pretrained(name, num_labels=num_labels, local_files_only=True)
        # Dropout is set in the config before loading: the dropout layers are built from it.
        for key in DROPOUT_KEYS:
            if dropout is not None and hasattr(config, key):
                setattr(config, key, dropout)
        model = AutoModelForSequenceClassification.from_pretrained(
            name, config=config, local_files_only=True, ignore_mismatched_sizes=True
        )
        return model, {"kind": "hf", "config": model.config.to_dict(), "pooling": "cls"}
    raise ValueError(
        f"model {name!r}: not a preset ({', '.join(BERT_PRESETS)}, linear, mlp) and not a local "
        "directory with a pretrained model"
    )


def bert_from_spec(spec: dict) -> nn.Module:
    """A freshly initialised model of the spec's architecture (the RNG state decides the
    weights)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    settings = dict(spec["config"])
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    model: nn.Module
    if spec.get("pooling", "cls") == "mean":
        model = MeanPooledBert(config)
    else:
        model = AutoModelForSequenceClassification.from_config(config)
    if spec.get("ngrams"):
        assert config.num_labels is not None  # every spec's config was built with its labels
        model = WideAndDeepBert(model, spec["ngrams"]["buckets"], config.num_labels)
    return model
