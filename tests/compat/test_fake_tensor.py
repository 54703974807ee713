"""``rankwise.compat.fake_tensor``: torch's own ``Module._apply`` still refuses to move a fake
parameter (so rankwise plan replaces it), and ``move_in_place`` moves one keeping its object."""

import pytest
import torch
from torch import nn

from rankwise.compat.fake_tensor import PATCHES, SEEN_ON, FakeTensorMode, is_fake, move_in_place
from rankwise.compat.versions import installed, series


def _fake_parameter(mode: FakeTensorMode) -> nn.Parameter:
    return nn.Parameter(mode.from_tensor(torch.randn(4, 3)))


def test_torchs_own_apply_refuses_a_fake_parameter():
    """When this fails, torch moves fake parameters itself: the plan's ``_apply`` can go."""
    module = nn.Module()
    module.weight = _fake_parameter(FakeTensorMode())
    with pytest.raises(RuntimeError, match="Couldn't swap"):
        module.to(torch.bfloat16)


def test_move_in_place_keeps_the_object_with_the_new_dtype_and_device():
    mode = FakeTensorMode()
    param = _fake_parameter(mode)
    with mode:
        # (what a CUDA build's .to("cuda", torch.bfloat16) returns; a CPU build makes it this way)
        on_gpu = torch.empty_like(param, device="cuda:0", dtype=torch.bfloat16)
    move_in_place(param, on_gpu)
    assert is_fake(param) and isinstance(param, nn.Parameter) and param.is_leaf
    assert (param.device, param.dtype, param.shape) == (
        torch.device("cuda:0"),
        torch.bfloat16,
        (4, 3),
    )
    with torch.no_grad():
        back = param.to("cpu", torch.float32)
    move_in_place(param, back)
    assert (param.device.type, param.dtype) == ("cpu", torch.float32)


def test_the_records_name_the_installed_series_and_real_targets():
    version = installed("torch")
    assert version is not None and series(version) in SEEN_ON
    owners = {"torch.nn.Module": nn.Module, "torch.Tensor": torch.Tensor}
    for record in PATCHES:
        owner, name = record.target.rsplit(".", 1)
        assert callable(getattr(owners[owner], name)), record.target
