"""``rankwise.compat.torch_dispatch``: a dispatch mode sees a fake pass's matrix products at the
dtype autocast runs them at (what MFU's peak is measured at)."""

import torch
from torch import nn

from rankwise.compat.torch_dispatch import SEEN_ON
from rankwise.compat.versions import installed, series
from rankwise.measure.flops import FlopCounter


def test_the_counted_pass_sees_matrix_products_at_autocasts_dtype():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    batch = {"x": torch.zeros(4, 8)}

    def forward(m, b):
        return m(b["x"])

    plain = FlopCounter(model, forward)
    assert plain.count(batch) > 0 and plain.dtype == torch.float32

    def bf16():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    mixed = FlopCounter(model, forward, bf16)
    assert mixed.count(batch) == plain.count(batch)  # the same FLOPs ...
    assert mixed.dtype == torch.bfloat16  # ... at the dtype the real pass computes them


def test_the_record_names_the_installed_series():
    version = installed("torch")
    assert version is not None and series(version) in SEEN_ON
