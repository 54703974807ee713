"""BERT-style sequence classifiers from ``transformers``: size presets or a local pretrained model."""

from __future__ import annotations

from pathlib import Path

from torch import nn

# Sizes for models trained from scratch.  tiny is ~1M parameters with a 6k vocabulary.
BERT_PRESETS: dict[str, dict] = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def build_bert(name: str, *, num_labels: int, dropout: float, vocab_size: int | None, pad_id: int,
               max_length: int) -> tuple[nn.Module, dict]:
    from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

    if name in BERT_PRESETS:
        if vocab_size is None:
            raise ValueError("a BERT preset needs the tokenizer's vocabulary size")
        config = BertConfig(vocab_size=vocab_size, max_position_embeddings=max_length, pad_token_id=pad_id,
                            num_labels=num_labels, hidden_dropout_prob=dropout,
                            attention_probs_dropout_prob=dropout, **BERT_PRESETS[name])
        model = BertForSequenceClassification(config)
    elif Path(name).is_dir():
        # A local pretrained model; never downloads (local_files_only).
        model = AutoModelForSequenceClassification.from_pretrained(
            name, num_labels=num_labels, local_files_only=True, ignore_mismatched_sizes=True)
        if dropout is not None and hasattr(model.config, "hidden_dropout_prob"):
            model.config.hidden_dropout_prob = dropout
    else:
        raise ValueError(f"model {name!r}: not a preset ({', '.join(BERT_PRESETS)}, linear, mlp) "
                         "and not a local directory with a pretrained model")
    return model, {"kind": "hf", "config": model.config.to_dict()}


def bert_from_spec(spec: dict) -> nn.Module:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    settings = dict(spec["config"])
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    return AutoModelForSequenceClassification.from_config(config)
