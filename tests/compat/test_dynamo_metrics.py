"""Dynamo's private records, as rankwise.compat.dynamo_metrics reads them, on the installed
torch."""

from __future__ import annotations

import torch

from rankwise.compat.dynamo_metrics import snapshot


def test_a_recompile_for_a_new_size_is_counted_timed_and_named():
    before = snapshot()
    layer = torch.compile(torch.nn.Linear(8, 4))
    layer(torch.randn(3, 8))
    layer(torch.randn(5, 8))  # a new size: recompiled, its first dimension dynamic from now on
    layer(torch.randn(7, 8))  # no recompile
    happened = snapshot() - before
    assert happened.graphs == 2 and happened.seconds > 0
    [reason] = happened.recompiles
    assert "size mismatch at index 0. expected 3, actual 5" in reason
