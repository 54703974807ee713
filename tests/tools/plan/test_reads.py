"""A model that reads values of its tensors in its forward (torch's nn.Transformer: is its mask
causal?) is measured under FSDP on fake tensors, each read answered with 0."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.tools.plan.capture import from_factory
from rankwise.tools.plan.fsdp_fake_ranks import fsdp


class _MaskedDecoder(nn.Module):
    """Lightning's demo Transformer in small: it builds its causal mask in its forward."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 512)
        self.transformer = nn.Transformer(batch_first=True)  # torch's defaults (batch first: ids')
        self.out = nn.Linear(512, 50)

    def forward(self, ids):
        t = ids.shape[1]
        mask = torch.tril(torch.ones(t, t)) == 1
        mask = mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, 0.0)
        x = self.embed(ids)
        return self.out(self.transformer(x, x, tgt_mask=mask))


def test_a_transformer_that_checks_its_mask_is_measured_and_the_row_says_what_it_answered():
    def build():
        model = _MaskedDecoder()
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    capture = from_factory(build, (torch.randint(0, 50, (4, 8)),))
    measured = fsdp(capture, 4, 2)
    assert measured.parameters > 0 and measured.peak > 0
    (note,) = measured.notes
    assert "value(s) of its fake tensors" in note and "answered 0 (False)" in note
