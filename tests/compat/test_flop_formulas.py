"""The CPU's fused attention counted as torch counts the GPU's flash kernel, on the installed
torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from rankwise.compat.flop_formulas import BACKWARD, FORWARD, cpu_attention


def _counted(backend: SDPBackend | None, backward: bool = True) -> dict[str, int]:
    query = torch.randn(2, 4, 64, 16, requires_grad=True)
    key = torch.randn(2, 4, 64, 16, requires_grad=True)
    with FlopCounterMode(display=False, custom_mapping=cpu_attention()) as counter:
        with sdpa_kernel(backend) if backend else torch.enable_grad():
            out = F.scaled_dot_product_attention(query, key, key)
        if backward:
            out.sum().backward()
    return {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}


def test_the_cpus_fused_attention_counts_what_its_matrix_products_do():
    fused, math = _counted(None), _counted(SDPBackend.MATH, backward=False)
    # torch's own counter gives the fused kernel nothing
    with FlopCounterMode(display=False) as plain:
        F.scaled_dot_product_attention(*[torch.randn(2, 4, 64, 16)] * 3)
    assert plain.get_total_flops() == 0
    # forward: Q K^T and P V, the math path's two matrix products (2 x 2 x 2*4*64*64*16)
    assert fused[f"aten.{FORWARD}"] == 2 * 2 * (2 * 4) * 64 * 64 * 16
    assert sum(math.values()) == fused[f"aten.{FORWARD}"]
    # backward: torch's GPU flash formula, which recomputes P: 2.5 x the forward
    assert fused[f"aten.{BACKWARD}"] == 5 * fused[f"aten.{FORWARD}"] // 2
