"""``rankwise.compat.torch_function``: inside the context a subclass's torch functions return plain
tensors."""

import torch

from rankwise.compat.torch_function import SEEN_ON, DisableTorchFunctionSubclass
from rankwise.compat.versions import installed, series


class _Marked(torch.Tensor):
    pass


def test_a_function_run_inside_it_returns_a_plain_tensor():
    marked = torch.arange(4.0).as_subclass(_Marked)
    assert type(marked[:2]) is _Marked  # (torch's default: the subclass spreads)
    with DisableTorchFunctionSubclass():
        assert type(marked[:2]) is torch.Tensor and type(marked * 2) is torch.Tensor


def test_the_record_names_the_installed_series():
    version = installed("torch")
    assert version is not None and series(version) in SEEN_ON
