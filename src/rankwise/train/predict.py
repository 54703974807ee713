"""Classify texts with a checkpoint: same tokenizer, same architecture, unwrapped weights."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer
from torch import nn

from rankwise.data.datasets import TokenizedTextDataset
from rankwise.data.ngrams import CharNgrams
from rankwise.data.tokenizer import TextEncoder
from rankwise.errors import CheckpointError
from rankwise.models import model_from_spec
from rankwise.train.artifacts import Checkpoint, load_checkpoint
from rankwise.train.evaluate import forward_logits


class Predictor:
    def __init__(
        self,
        model: nn.Module,
        encoder: TextEncoder,
        label_names: list[str],
        ngrams: CharNgrams | None = None,
    ):
        self.model = model.eval()
        self.encoder = encoder
        self.label_names = label_names
        self.ngrams = ngrams
        """The character n-gram hashing the model was trained with (None: tokens only)."""

    @classmethod
    def from_checkpoint(cls, path) -> Predictor:
        checkpoint: Checkpoint = load_checkpoint(path)
        if checkpoint.tokenizer_json is None:
            raise CheckpointError(f"{checkpoint.path} has no tokenizer: it was not trained on text")
        model = model_from_spec(checkpoint.model_spec)
        model.load_state_dict(checkpoint.weights)
        encoder = TextEncoder(Tokenizer.from_str(checkpoint.tokenizer_json), checkpoint.max_length)
        ngrams = CharNgrams.from_dict(checkpoint.model_spec.get("ngrams"))
        return cls(model, encoder, checkpoint.label_names, ngrams)

    @torch.no_grad()
    def probabilities(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        ids = self.encoder.encode(texts)
        ngrams = self.ngrams.encode(texts) if self.ngrams else None
        dataset = TokenizedTextDataset(ids, [0] * len(ids), self.encoder.pad_id, ngrams)
        out = []
        for start in range(0, len(ids), batch_size):
            batch = dataset.collate(
                [dataset[i] for i in range(start, min(start + batch_size, len(ids)))]
            )
            out.append(forward_logits(self.model, batch).float().softmax(dim=-1))
        return torch.cat(out)

    def predict(self, texts: list[str]) -> list[dict]:
        probs = self.probabilities(texts)
        best = probs.argmax(dim=-1)
        return [
            {
                "label": self.label_names[int(i)],
                "probability": float(p[i]),
                "probabilities": {name: round(float(x), 6) for name, x in zip(self.label_names, p)},
            }
            for i, p in zip(best, probs)
        ]
