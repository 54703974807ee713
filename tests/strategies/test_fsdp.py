"""FSDP's own behaviour: at a mixed precision it gathers the parameters in the half dtype and keeps
fp32 shards for the optimizer (FSDP2's MixedPrecisionPolicy, as torchtitan configures it)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.support.multiproc import run_ranks

WIDTH, LAYERS = 32, 3


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(nn.Module):
    _no_split_modules = ["Block"]  # (each block its own FSDP unit, as a transformers model's)

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _one_step(precision: str) -> dict:
    """One rank: one optimizer step of fsdp at ``precision``, FSDP's all-gathers and
    reduce-scatters counted (bytes and dtypes of the collectives FSDP2 calls,
    ``torch.distributed.all_gather_single`` and ``reduce_scatter_single``)."""
    import torch.distributed as dist

    import rankwise

    seen: dict[str, list[tuple[int, torch.dtype]]] = {"all_gather": [], "reduce_scatter": []}
    originals = dist.all_gather_single, dist.reduce_scatter_single

    def all_gather_single(output, input, *args, **kwargs):
        seen["all_gather"].append((output.numel() * output.element_size(), output.dtype))
        return originals[0](output, input, *args, **kwargs)

    def reduce_scatter_single(output, input, *args, **kwargs):
        seen["reduce_scatter"].append((input.numel() * input.element_size(), input.dtype))
        return originals[1](output, input, *args, **kwargs)

    with rankwise.setup("fsdp", precision, seed=0) as rt:
        model = Net()
        numel = sum(p.numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = rt.prepare(model, optimizer)
        dist.all_gather_single, dist.reduce_scatter_single = (
            all_gather_single,
            reduce_scatter_single,
        )
        try:
            x, y = torch.randn(8, WIDTH), torch.randint(0, 4, (8,))
            with rt.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            rt.backward(loss, model)
            rt.step(optimizer, model)
        finally:
            dist.all_gather_single, dist.reduce_scatter_single = originals
        return {
            "numel": numel,
            "gathered": sum(size for size, _ in seen["all_gather"]),
            "gather_dtypes": {str(dtype) for _, dtype in seen["all_gather"]},
            "reduced_dtypes": {str(dtype) for _, dtype in seen["reduce_scatter"]},
            "shards": {str(p.to_local().dtype) for p in model.parameters()},
            "moments": {
                str(value.dtype)
                for state in optimizer.state.values()
                for key, value in state.items()
                if key != "step"
            },
            "logits": str(model(x).dtype),
        }


@pytest.mark.multiproc
def test_bf16_mixed_gathers_bf16_reduces_fp32_and_keeps_fp32_shards():
    """Was: autocast over fp32 shards, which all-gathered fp32 parameters (twice the bytes) and
    kept a bf16 copy of each weight for the backward pass."""
    full = run_ranks(_one_step, 2, "32-true", timeout=120)[0]
    mixed = run_ranks(_one_step, 2, "bf16-mixed", timeout=120)[0]
    print(
        f"all-gathered per step at 2 ranks: 32-true {full['gathered']} B, bf16-mixed "
        f"{mixed['gathered']} B"
    )
    assert full["gather_dtypes"] == {"torch.float32"}
    assert mixed["gather_dtypes"] == {"torch.bfloat16"}
    # (each unit gathered for the forward and again for the backward, the root once: a unit's
    # flat buffer is padded to a multiple of the world size)
    assert mixed["gathered"] * 2 == full["gathered"]
    assert full["gathered"] >= 4 * full["numel"]
    assert mixed["reduced_dtypes"] == full["reduced_dtypes"] == {"torch.float32"}
    assert mixed["shards"] == mixed["moments"] == {"torch.float32"}  # what the optimizer steps
    assert mixed["logits"] == "torch.bfloat16"
