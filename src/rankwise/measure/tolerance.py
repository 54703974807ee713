"""How far a distributed run may end from one process: the equivalence tolerances rankwise states.

Two judgements use them.

* The strategy tests, and the ``rankwise bench`` rows verify cannot judge, compare the weights after
  the same first steps (same data order and seed, dropout off) by their largest absolute difference.
* ``rankwise verify`` and ``rankwise bench`` (its other rows, and ``--script``'s) judge step by
  step, in lockstep, what distribution is responsible for (:func:`gradient_difference`): one process
  takes each step from the N-rank run's weights, so differences never compound, and the gradient the
  N ranks' optimizer received must be the one process's gradient up to :func:`gradient_tolerance`,
  relative to its size.  The optimizer then steps from the same weights with that same gradient, so
  each tensor's update must be one process's update of it to :data:`UPDATE` of that update's size
  (:func:`update_difference`), and the optimizer's settings must be equal (compared by
  :mod:`rankwise.tools.verify.hyperparameter_diff`); the loss agrees to :func:`tolerance`.  Not the
  weights to an absolute tolerance: a whole Adam step at lr 2e-7 moves a weight by about 2e-7, so a
  learning rate twice one process's stayed under it.  An optimizer that amplifies rounding
  (Adam's update ``m / (sqrt(v) + eps)`` is nearly a sign for a gradient near ``eps``: the last bit
  the all-reduce's summation order leaves in it becomes a step of size ``lr``) can then no longer
  pass off summation order as a defect.

At fp32 only the order of the summations differs; a compressed gradient exchange or a lower
precision adds its rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

EXACT = 1e-5
"""fp32 with exact gradient averaging (every strategy's default)."""

COMM_HOOK = {"fp16_compress": 1e-3, "bf16_compress": 1e-3, "powersgd": 1e-2}
"""DDP's compressed all-reduce (``ddp.comm_hook``).  Measured after 20 steps of the tiny model on
`sentiment` at 2 ranks: fp16 1.9e-4, bf16 6.4e-5, PowerSGD rank 1 2.3e-3."""

PRECISION = {"bf16-mixed": 2e-2, "16-mixed": 2e-2}
"""Lower-precision compute against the fp32 single-process reference."""


GRADIENT = 5e-5
"""fp32 gradients, relative (:func:`gradient_difference`): summation-order noise between 2 ranks and
one process measured 1.1e-7 .. 1.7e-7 over 50 steps of the GPT-2 example and 6.7e-7 .. 2.1e-6 in the
CNN example (convolutions sum over batch x height x width), both at torch's defaults; the smallest
real difference verify must catch, DDP's fp16 compression hook, 2.7e-4 .. 3.5e-4 (fp16's 11
significant bits).  The tolerance sits 25x above the one and 5x below the other."""

TF32 = 2e-3
"""fp32 tensors multiplied on a GPU's TF32 units (10 significant bits, torch's default for cuDNN
convolutions): each product rounds as fp16 would, and the ranks' smaller batches may take other
kernels than one process."""


def gradient_tolerance(precision: str = "32-true", tf32: bool = False) -> float:
    """How far, relatively, the gradient an N-rank step applied may be from one process's at the
    same weights: exact averaging at fp32, the rounding of the arithmetic the run really does
    otherwise (a comm hook is never excused here: verify names it as the compression it is)."""
    return max(GRADIENT, PRECISION.get(precision, GRADIENT), TF32 if tf32 else GRADIENT)


def tolerance(precision: str = "32-true", comm_hook: str = "none") -> float:
    """The stated tolerance for a run at ``precision`` with ``comm_hook``: the loosest that
    applies."""
    return max(EXACT, COMM_HOOK.get(comm_hook, EXACT), PRECISION.get(precision, EXACT))


def tensor_differences(
    weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
) -> dict[str, float]:
    """Each tensor's largest absolute difference, compared in fp32, for the keys both hold with one
    shape."""
    return {
        key: (weights[key].float() - reference[key].float()).abs().max().item()
        for key in reference
        if key in weights and weights[key].shape == reference[key].shape
    }


def max_param_diff(
    weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
) -> float:
    """The largest absolute difference between two sets of weights, compared in fp32, key by key.

    Both must hold the same keys: a missing or extra tensor is an error naming it, not a pass.
    """
    if weights.keys() != reference.keys():
        missing, extra = (
            sorted(reference.keys() - weights.keys()),
            sorted(weights.keys() - reference.keys()),
        )
        raise KeyError(
            f"the weights hold different tensors: missing {missing[:5]}, extra {extra[:5]}"
        )
    reshaped = [key for key in reference if weights[key].shape != reference[key].shape]
    if reshaped:
        raise KeyError(f"the weights hold tensors of other shapes: {reshaped[:5]}")
    return max(tensor_differences(weights, reference).values(), default=0.0)


def gradient_difference(
    candidate: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], top: int = 3
) -> dict:
    """How far ``candidate``'s gradients are from ``reference``'s, taken at the same weights: the
    criterion.

    ``difference`` is the norm of the whole gradient's difference relative to the whole reference
    gradient's norm, ``|c - r| / |r|`` over every parameter together.  Summation order leaves each
    element an error proportional to the terms it summed, not to the sum: a gradient that cancels to
    almost nothing (an attention key's bias, the bias of a softmax's last layer, whose per-sample
    gradients sum to zero over the classes) keeps a rounding error that is large against itself and
    negligible against the whole gradient.  What distribution can get wrong — a loss averaged per
    micro-batch, statistics of a rank's share, a compressed or summed exchange, other samples —
    changes the whole gradient.  ``top``: the tensors whose own difference is largest against the
    whole gradient's norm; ``scale``: the least-squares factor ``<c, r> / <r, r>`` (2.0 or 0.5 when
    the gradients were summed over ranks instead of averaged, or averaged twice); ``only_one``:
    tensors one side has a non-zero gradient for and the other none (compared as zero, and a
    difference of their own; ZeRO gives a parameter the forward did not use a gradient of zeros, not
    none)."""
    names = sorted(reference.keys() | candidate.keys())
    zero = torch.zeros(())
    pairs = {
        name: (candidate.get(name, zero).double(), reference.get(name, zero).double())
        for name in names
    }
    gaps = {name: float((c - r).norm()) for name, (c, r) in pairs.items()}
    whole = math.sqrt(sum(float(r.square().sum()) for _, r in pairs.values()))
    gap = math.sqrt(sum(g * g for g in gaps.values()))
    dot = sum(float((c * r).sum()) for c, r in pairs.values())
    relative = {
        name: g / whole if whole > 0 else (0.0 if g == 0 else math.inf) for name, g in gaps.items()
    }
    return {
        "difference": gap / whole if whole > 0 else (0.0 if gap == 0 else math.inf),
        "top": sorted(relative.items(), key=lambda item: -item[1])[:top],
        "scale": dot / whole**2 if whole > 0 else None,
        "only_one": sorted(name for name in reference.keys() ^ candidate.keys() if gaps[name] > 0),
    }


UPDATE = 1e-4
"""Relative, per tensor (:func:`update_difference`): how far a tensor's update in a step on N ranks
may be from one process's update of it, against that update's own size, beyond one unit in the last
place of the weight.

Measured with ``scripts/update_noise.py`` (``rankwise verify --keep-weights`` on equivalent scripts,
fp32, 2 ranks against one process in lockstep, CPU, torch 2.13; the largest difference of any tensor
at any step): exactly 0 over 6 steps for AdamW under plain DDP, Accelerate, plain FSDP2 and a
DeepSpeed 0.19 ZeRO-2 engine script, for SGD with momentum and OneCycleLR (a CNN) and plain SGD
(pytorch's DDP tutorial), and for rankwise's ddp on the tiny BERT: in lockstep both optimizers step
from the same weights with the same gradient and the same state, so the update is the same bit for
bit. Over 10 steps, where the optimizer state is sharded: tiny BERT fsdp 4.8e-07, deepspeed-zero2
1.2e-06, deepspeed-zero3 1.6e-06; the GPT-2 example fsdp 4.9e-08, deepspeed-zero2 4.7e-08 (attention
key and classifier biases, whose gradients nearly cancel). Without the one-ulp allowance the sharded
runs reach 4.0e-05 (an update a few ulps of its weight, rounded the other way): the allowance is
what keeps the floor 60x below the tolerance. The smallest real difference it must catch is a
learning rate changed by a factor: every update moves by that factor, so a rate 1e-4 of itself away
fails on the update alone (any change a parameter group shows fails on the settings, compared
exactly: :mod:`rankwise.tools.verify.hyperparameter_diff`)."""


def _spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distance from each of ``values`` (float64) to the next number of ``dtype``: one unit in
    the last place (the subnormals' spacing near zero)."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(values.abs().clamp(min=info.tiny))
    # (|x| in [2^(e-1), 2^e): its spacing is eps * 2^(e-1))
    return torch.pow(2.0, exponent.double() - 1) * info.eps


def update_difference(
    after: Mapping[str, torch.Tensor],
    reference_after: Mapping[str, torch.Tensor],
    before: Mapping[str, torch.Tensor],
    reference_before: Mapping[str, torch.Tensor],
    top: int = 3,
    held_in: torch.dtype | None = None,
) -> dict:
    """How far the N-rank step's update of each tensor, ``after - before``, is from one process's,
    ``reference_after - reference_before``, relative to one process's update of that tensor: the
    criterion for the weights after a step.

    Per tensor, ``|gap| / |Δ_1|`` with ``gap = max(0, |Δ_N - Δ_1| - ulp)`` element by element: both
    runs start the step from the same weights (lockstep), so ``Δ_N - Δ_1`` is the difference of the
    weights after it, and the last rounding of ``w + Δ`` may move either by one unit in the last
    place of the weight (``ulp``, in the weights' own dtype) whatever the update: an update smaller
    than a few ulps of its weight (lr 2e-7 on a LayerNorm weight of 1.0, whose ulp is 1.2e-7) is
    rounded to whole ulps in both runs.  A tensor one process did not move (``Δ_1 = 0``: frozen, a
    learning rate of 0 in a warm-up's first step) differs when the N ranks moved it at all (inf).
    ``held_in``: the dtype the parameters were held in where it is coarser than the recorded
    tensors' (16-bit parameters, written as fp32): the ulp is that dtype's, since both runs round
    each step's result to it (DeepSpeed's bf16 parameters, copied from fp32 masters that the one
    process, starting from the rounded weights, does not share).
    An absolute tolerance on the weights cannot stand in for this: a whole Adam step at lr 2e-7
    moves a weight by about 2e-7, so a learning rate twice one process's stays under 1e-5 of
    weights difference while the update differs by 100 %.

    ``difference``: the largest tensor's relative difference; ``top``: the tensors that differ most
    (name, relative difference); ``whole``: the same over every tensor together (``|gap| / |Δ_1|``
    over the whole update, for steps taken from other weights, where a tensor whose update is all
    rounding cannot be judged alone); ``moved``: whether one process's step moved any weight."""
    relative: dict[str, float] = {}
    gaps = sizes = 0.0
    for name, reference in reference_after.items():
        if name not in after or name not in before or name not in reference_before:
            continue
        tensors = (after[name], reference, before[name], reference_before[name])
        if len({t.shape for t in tensors}) > 1:
            continue
        mine, theirs = (
            tensors[0].double() - tensors[2].double(),
            (tensors[1].double() - tensors[3].double()),
        )
        gap = (mine - theirs).abs()
        if reference.is_floating_point():
            largest = torch.stack([t.double().abs() for t in tensors]).amax(0)
            dtype = reference.dtype
            if held_in is not None and torch.finfo(held_in).eps > torch.finfo(dtype).eps:
                dtype = held_in
            gap = (gap - _spacing(largest, dtype)).clamp(min=0)
        gap_norm, size = float(gap.norm()), float(theirs.norm())
        gaps, sizes = gaps + gap_norm**2, sizes + size**2
        relative[name] = gap_norm / size if size > 0 else (0.0 if gap_norm == 0 else math.inf)
    whole = math.sqrt(gaps) / math.sqrt(sizes) if sizes > 0 else (0.0 if gaps == 0 else math.inf)
    return {
        "difference": max(relative.values(), default=0.0),
        "top": sorted(relative.items(), key=lambda item: -item[1])[:top],
        "whole": whole,
        "moved": sizes > 0,
    }
