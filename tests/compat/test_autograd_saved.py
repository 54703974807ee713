"""``rankwise.compat.autograd_saved``: the saved values rankwise reads, on the installed torch."""

import torch
import torch.nn.functional as F

from rankwise.compat.autograd_saved import SEEN_ON, saved
from rankwise.compat.versions import installed, series


def test_the_three_saved_values_read_as_recorded():
    x = torch.randn(8, 2, requires_grad=True)
    assert tuple(saved(x.sum().grad_fn, "self_sym_sizes")) == (8, 2)
    summed = F.cross_entropy(x, torch.zeros(8, dtype=torch.long), reduction="sum")
    assert saved(summed.grad_fn, "reduction") == 2 and saved(summed.grad_fn, "self").shape == (8, 2)
    assert float(saved((x.sum() * 0.5).grad_fn, "other")) == 0.5
    assert saved(x.sum().grad_fn, "nothing", "none") == "none"


def test_a_value_freed_by_its_backward_reads_as_the_default():
    x = torch.randn(3, requires_grad=True)
    loss = (x * x).sum() * 2.0
    loss.backward()
    assert saved(loss.grad_fn, "other", "freed") == "freed"


def test_the_record_names_the_installed_series():
    version = installed("torch")
    assert version is not None and series(version) in SEEN_ON
