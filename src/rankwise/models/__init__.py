"""Model builders.  Every model maps a batch's inputs to class logits.

A model is described by a *spec* (a JSON-able dict) saved with each checkpoint, so
``predict`` and ``export`` rebuild the exact architecture without the training config.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from rankwise.models.bert import BERT_PRESETS, bert_from_spec, build_bert
from rankwise.models.toy_nets import TOY_MODELS, build_toy, toy_from_spec


def build_model(
    name: str,
    *,
    num_labels: int,
    dropout: float,
    vocab_size: int | None = None,
    pad_id: int = 0,
    max_length: int = 128,
    features: int | None = None,
    split_devices: bool = False,
    local_rank: int = 0,
    pooling: str = "cls",
    ngrams: dict | None = None,
) -> tuple[nn.Module, dict]:
    """Return ``(model, spec)``; ``ngrams`` (the data's character n-gram settings) adds a BERT
    preset's bag-of-n-grams path."""
    if name in TOY_MODELS:
        if features is None:
            raise ValueError(f"model {name!r} needs feature inputs: use it with --data toy")
        return build_toy(name, features, num_labels, dropout, split_devices, local_rank)
    if features is not None:
        raise ValueError(f"model {name!r} reads text; with --data toy use --model linear or mlp")
    return build_bert(
        name,
        num_labels=num_labels,
        dropout=dropout,
        vocab_size=vocab_size,
        pad_id=pad_id,
        max_length=max_length,
        pooling=pooling,
        ngrams=ngrams,
    )


def check_model(name: str, *, reads_text: bool, max_length: int) -> None:
    """Raise ``ValueError`` when model ``name`` cannot train on this data: called before any worker
    starts."""
    if name in TOY_MODELS:
        if reads_text:
            raise ValueError(
                f"model {name!r} reads feature vectors: use a BERT preset or a local pretrained "
                "path with this data"
            )
        return
    if name in BERT_PRESETS:
        if not reads_text:
            raise ValueError(f"model {name!r} reads text: use --model linear or mlp with this data")
        return
    if not Path(name).is_dir():
        raise ValueError(
            f"model {name!r}: not a preset ({', '.join(model_names())}) and not a local directory "
            "with a pretrained model"
        )
    if not reads_text:
        raise ValueError(
            f"model {name!r} is a pretrained text model: with --data toy use --model linear or mlp"
        )
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"model {name!r}: cannot read its config.json ({e})") from None
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and max_length > positions:
        raise ValueError(
            f"data.max_length={max_length} is longer than model {name!r} reads "
            f"(max_position_embeddings={positions})"
        )


def reads_ngrams(spec: dict) -> bool:
    """Whether the model built from ``spec`` also needs each text's character n-grams."""
    return bool(spec.get("ngrams"))


def model_from_spec(spec: dict) -> nn.Module:
    """Rebuild a freshly initialised model from a saved spec (weights are loaded separately)."""
    if spec["kind"] == "toy":
        return toy_from_spec(spec)
    return bert_from_spec(spec)


def model_names() -> list[str]:
    return [*BERT_PRESETS, *TOY_MODELS]
