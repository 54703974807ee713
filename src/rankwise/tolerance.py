"""How far a distributed run may end from one process: the equivalence tolerances rankwise states.

Measured as the largest absolute parameter difference against ``single`` after the same
first steps (same data order and seed, dropout off).  At fp32 only the order of the
summations differs; a compressed gradient exchange or a lower precision adds its
rounding, step after step.  Tests and ``rankwise bench`` judge runs by these numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

EXACT = 1e-5
"""fp32 with exact gradient averaging (every strategy's default)."""

COMM_HOOK = {"fp16_compress": 1e-3, "bf16_compress": 1e-3, "powersgd": 1e-2}
"""DDP's compressed all-reduce (``ddp.comm_hook``).  Measured after 20 steps of the tiny model on
`sentiment` at 2 ranks: fp16 1.9e-4, bf16 6.4e-5, PowerSGD rank 1 2.3e-3."""

PRECISION = {"bf16-mixed": 2e-2, "16-mixed": 2e-2}
"""Lower-precision compute against the fp32 single-process reference."""


def tolerance(precision: str = "32-true", comm_hook: str = "none") -> float:
    """The stated tolerance for a run at ``precision`` with ``comm_hook``: the loosest that applies."""
    return max(EXACT, COMM_HOOK.get(comm_hook, EXACT), PRECISION.get(precision, EXACT))


def tensor_differences(weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Each tensor's largest absolute difference, compared in fp32, for the keys both hold with one shape."""
    return {key: (weights[key].float() - reference[key].float()).abs().max().item()
            for key in reference if key in weights and weights[key].shape == reference[key].shape}


def max_param_diff(weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> float:
    """The largest absolute difference between two sets of weights, compared in fp32, key by key.

    Both must hold the same keys: a missing or extra tensor is an error naming it, not a pass.
    """
    if weights.keys() != reference.keys():
        missing, extra = sorted(reference.keys() - weights.keys()), sorted(weights.keys() - reference.keys())
        raise KeyError(f"the weights hold different tensors: missing {missing[:5]}, extra {extra[:5]}")
    reshaped = [key for key in reference if weights[key].shape != reference[key].shape]
    if reshaped:
        raise KeyError(f"the weights hold tensors of other shapes: {reshaped[:5]}")
    return max(tensor_differences(weights, reference).values(), default=0.0)
