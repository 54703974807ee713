"""A loss summed over its batch, read from its autograd graph (the reference-free loss-mean
check)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rankwise.tools.watch.reduction import summed_over_batch


def _out(rows=8):
    return torch.nn.Linear(4, 2)(torch.randn(rows, 4))


def test_a_sum_over_the_batch_is_found_under_factors_of_one():
    out, labels = _out(), torch.zeros(8, dtype=torch.long)
    found = summed_over_batch(out.sum(), 8)
    assert found == ".sum() of a (8, 2) tensor, its first dimension the batch"
    # Lightning's closure divides by accumulate_grad_batches (1)
    assert summed_over_batch(out.sum() / 1, 8) is not None
    assert summed_over_batch(out.sum(), None) is not None  # (no DataLoader: two dimensions or more)
    summed = summed_over_batch(F.cross_entropy(out, labels, reduction="sum"), 8)
    assert summed == 'NllLoss with reduction="sum" over 8 rows'


def test_a_mean_or_a_normalised_sum_is_not():
    out, labels = _out(), torch.zeros(8, dtype=torch.long)
    assert summed_over_batch(out.mean(), 8) is None
    assert summed_over_batch(F.cross_entropy(out, labels), 8) is None
    assert summed_over_batch(out.sum(dim=1).mean(), 8) is None
    assert summed_over_batch(out.sum() / 8, 8) is None  # (a mean, written as one)
    # the global-token normalisation: summed token losses x world size / the step's count
    assert summed_over_batch(out.sum() * 2 / 13, 8) is None
    assert summed_over_batch(out.sum() * torch.tensor(1.0, requires_grad=True), 8) is None


def test_a_sum_of_other_things_than_the_batch_is_not():
    parts = torch.stack([_out().mean(), _out().mean(), _out().mean()])
    assert summed_over_batch(parts.sum(), 8) is None  # three loss terms, not 3 samples
    assert summed_over_batch(parts.sum(), None) is None
    assert summed_over_batch(_out(rows=1).sum(), 1) is None


def test_it_reads_its_factors_under_a_dispatch_mode():
    # The first step's FLOP count runs the forward and backward under a dispatch mode, which hands
    # an op a Python scalar's tensor back as the scalar: reading the factor must dispatch nothing.
    from rankwise.compat.torch_dispatch import TorchDispatchMode

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        out = _out()
        assert summed_over_batch(out.sum() / 1, 8) is not None
        assert summed_over_batch(out.sum() * 0.5, 8) is None
