"""Finding a model's transformer layers, and checkpointing their activations."""

import pytest
import torch
from torch import nn

from rankwise.errors import ConfigError
from rankwise.models.bert import build_bert
from rankwise.strategies.blocks import checkpoint_blocks, transformer_blocks


def _bert(pooling="cls", ngrams=None):
    torch.manual_seed(0)
    model, _ = build_bert(
        "tiny",
        num_labels=3,
        dropout=0.1,
        vocab_size=100,
        pad_id=0,
        max_length=64,
        pooling=pooling,
        ngrams=ngrams,
    )
    return model


def _saved_bytes(model: nn.Module, inputs: dict) -> int:
    """Bytes autograd keeps for the backward pass of one forward."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        _logits(model, inputs).sum().backward()
    return sum(saved)


def _logits(model: nn.Module, inputs: dict) -> torch.Tensor:
    output = model(**inputs)
    return getattr(output, "logits", output)


@pytest.mark.parametrize(
    "pooling,ngrams", [("cls", None), ("mean", None), ("cls", {"buckets": 64})]
)
def test_every_bert_layer_is_found_once(pooling, ngrams):
    # BertForSequenceClassification names no _no_split_modules: its layers are found by their base
    # class.
    blocks = transformer_blocks(_bert(pooling, ngrams))
    assert [type(b).__name__ for b in blocks] == ["BertLayer", "BertLayer"]


def test_a_users_model_opts_in_by_naming_its_block_class():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return x + self.inner(x)

    class Net(nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(Block(), Block(), Block())

        def forward(self, x):
            return self.blocks(x)

    net = Net()
    assert transformer_blocks(net) == list(net.blocks)
    with pytest.raises(ConfigError, match="_no_split_modules"):
        checkpoint_blocks(nn.Sequential(nn.Linear(4, 4)))


def test_checkpointed_layers_keep_less_and_compute_the_same():
    inputs = {
        "input_ids": torch.randint(1, 100, (8, 64)),
        "attention_mask": torch.ones(8, 64, dtype=torch.long),
    }
    plain, checkpointed = _bert(), _bert()
    names = [name for name, _ in plain.named_parameters()]
    plain_bytes = _saved_bytes(plain, inputs)
    assert checkpoint_blocks(checkpointed) == 2
    assert checkpoint_blocks(checkpointed) == 2  # a second prepare does not wrap twice
    torch.manual_seed(1)
    checkpointed_bytes = _saved_bytes(checkpointed, inputs)
    print(
        f"saved for backward: {plain_bytes / 1e6:.2f} MB plain, {checkpointed_bytes / 1e6:.2f} MB "
        "checkpointed"
    )
    assert checkpointed_bytes < 0.6 * plain_bytes
    # checkpoints and exports unchanged
    assert [name for name, _ in checkpointed.named_parameters()] == names
    # DataParallel's replicas copy a module's attributes: each must recompute with its own weights,
    # not the original's.
    layer = transformer_blocks(checkpointed)[0]
    replica = layer._replicate_for_data_parallel()
    assert "forward" not in replica.__dict__ and replica.forward.__self__ is replica
    assert isinstance(layer, type(plain.bert.encoder.layer[0])) and type(replica) is type(layer)
    plain.zero_grad()
    checkpointed.zero_grad()
    for model in (plain, checkpointed):  # with dropout: the recomputation replays the same masks
        torch.manual_seed(2)
        _logits(model, inputs).sum().backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
