"""The equivalence criterion itself: the same gradient summed in another order passes; a gradient
that a rank count changes (a loss averaged per micro-batch, gradients summed instead of averaged,
fp16 compression) fails."""

from __future__ import annotations

import torch
from torch import nn

from rankwise.measure.tolerance import GRADIENT, gradient_difference, gradient_tolerance


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def _batch(samples: int = 64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 16, generator=g)
    labels = torch.randint(0, 4, (samples,), generator=g)
    # Each sample weighs its loss by how many of its positions count (as tokens that are not padding
    # do).
    tokens = torch.randint(1, 9, (samples,), generator=g).float()
    return x, labels, tokens


def _gradients(
    model: nn.Module, parts: list[tuple[torch.Tensor, ...]], loss_of
) -> dict[str, torch.Tensor]:
    """The gradient of the mean of ``loss_of(part)`` over ``parts``, as N ranks averaging their own
    would give it."""
    model.zero_grad()
    for part in parts:
        (loss_of(model, *part) / len(parts)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _token_mean(model, x, labels, tokens):
    """Mean over the global batch's tokens, written as each part's token sum x parts / all tokens
    (exact)."""
    return (
        nn.functional.cross_entropy(model(x), labels, reduction="none") * tokens
    ).sum() / ALL_TOKENS[0]


def _micro_mean(model, x, labels, tokens):
    """The defect: the loss averaged over this part's own tokens."""
    return (
        nn.functional.cross_entropy(model(x), labels, reduction="none") * tokens
    ).sum() / tokens.sum()


ALL_TOKENS = [0.0]


def _split(batch, parts: int):
    return list(zip(*(t.chunk(parts) for t in batch), strict=True))


def test_the_same_gradient_summed_in_another_order_passes():
    model, batch = _model(), _batch()
    one = _gradients(model, [batch], lambda m, x, y, t: nn.functional.cross_entropy(m(x), y))
    two = _gradients(
        model, _split(batch, 2), lambda m, x, y, t: nn.functional.cross_entropy(m(x), y)
    )
    reversed_batch = tuple(t.flip(0) for t in batch)
    backwards = _gradients(
        model, _split(reversed_batch, 4), lambda m, x, y, t: nn.functional.cross_entropy(m(x), y)
    )
    for other in (two, backwards):
        assert any(not torch.equal(other[k], one[k]) for k in one)  # the rounding really differs...
        result = gradient_difference(other, one)
        assert result["difference"] < GRADIENT / 10, result  # ...and stays far below the tolerance
        assert abs(result["scale"] - 1) < 1e-6 and result["only_one"] == []


def test_a_loss_averaged_per_micro_batch_fails():
    model, batch = _model(), _batch()
    ALL_TOKENS[0] = float(batch[2].sum())
    one = _gradients(model, [batch], _token_mean)
    exact = _gradients(model, _split(batch, 2), lambda m, *part: 2 * _token_mean(m, *part))
    # tokens counted over the whole batch
    assert gradient_difference(exact, one)["difference"] < GRADIENT / 10
    wrong = gradient_difference(_gradients(model, _split(batch, 2), _micro_mean), one)
    assert wrong["difference"] > 100 * GRADIENT, wrong


def test_a_summed_or_compressed_exchange_fails_and_a_gradient_zero_but_for_rounding_does_not():
    model, batch = _model(), _batch()
    one = _gradients(model, [batch], lambda m, x, y, t: nn.functional.cross_entropy(m(x), y))
    summed = gradient_difference({k: 2 * v for k, v in one.items()}, one)
    assert summed["difference"] > 0.5 and abs(summed["scale"] - 2) < 1e-9
    # fp16_compress: divide, round, sum
    halved = {k: (v / 2).half().float() * 2 for k, v in one.items()}
    assert gradient_difference(halved, one)["difference"] > GRADIENT
    # A tensor whose gradient is zero in exact arithmetic (an attention key's bias) keeps only
    # rounding: judged against its share of the whole gradient, not against itself.
    noisy_zero = {**one, "zero": torch.full((4,), 1e-12)}
    assert (
        gradient_difference(noisy_zero, {**one, "zero": torch.zeros(4)})["difference"]
        < GRADIENT / 10
    )
    missing = gradient_difference({k: v for k, v in one.items() if k != "0.bias"}, one)
    assert missing["only_one"] == ["0.bias"] and missing["difference"] > 100 * GRADIENT
    # ZeRO hands a parameter the forward did not use a gradient of zeros where one process has none:
    # the same.
    unused = gradient_difference({**one, "spare": torch.zeros(3)}, one)
    assert unused["only_one"] == [] and unused["difference"] == 0


def test_the_tolerance_follows_the_arithmetic_the_run_does():
    assert gradient_tolerance() == GRADIENT
    assert gradient_tolerance("bf16-mixed") > gradient_tolerance("32-true", tf32=True) > GRADIENT


def _adamw_steps(lrs: list[float], steps: int = 3) -> list[dict[str, torch.Tensor]]:
    """The weights after each of ``steps`` AdamW steps (torch's defaults but the rate) at each
    learning rate of ``lrs`` per step, from the same weights, with the same gradients: the weights
    before every step, then after it."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lrs[0])
    x, labels, _ = _batch()
    states = [{name: p.detach().clone() for name, p in model.named_parameters()}]
    for lr in lrs[:steps]:
        for group in optimizer.param_groups:
            group["lr"] = lr
        model.zero_grad()
        nn.functional.cross_entropy(model(x), labels).backward()
        optimizer.step()
        states.append({name: p.detach().clone() for name, p in model.named_parameters()})
    return states


def test_a_learning_rate_twice_one_processs_at_2e_5_fails_the_update_not_the_old_weight_tolerance():
    """Accelerate's nlp_example at 2 ranks: its warm-up runs twice as fast (4e-7 against 2e-7).  A
    whole Adam step at that rate moves a weight by ~lr: the weights stay within the old absolute
    1e-5 while the update differs by 100 % of itself."""
    from rankwise.measure.tolerance import EXACT, UPDATE, max_param_diff, update_difference

    one = _adamw_steps([2e-7, 4e-7, 6e-7])
    many = _adamw_steps([4e-7, 8e-7, 1.2e-6])
    # (lockstep: the step starts from the same weights in both; here step 1, from the same start)
    assert max_param_diff(many[1], one[1]) < EXACT  # what the old criterion accepted
    found = update_difference(many[1], one[1], one[0], one[0])
    assert abs(found["difference"] - 1.0) < 0.05 and found["difference"] > UPDATE
    assert found["moved"] and found["top"][0][1] == found["difference"]


def test_the_same_update_rounded_otherwise_passes_and_a_tensor_only_one_run_moved_does_not():
    from rankwise.measure.tolerance import UPDATE, update_difference

    before, after = _adamw_steps([2e-5], steps=1)
    # each weight one unit in its last place away, as the last rounding of w + Δ may leave it
    rounded = {
        name: torch.nextafter(t, torch.where(torch.rand_like(t) < 0.5, t - 1, t + 1))
        for name, t in after.items()
    }
    assert update_difference(rounded, after, before, before)["difference"] == 0.0
    # the update itself computed with rounding of its own (one part in 10^7)
    noisy = {name: before[name] + (after[name] - before[name]) * (1 + 1e-7) for name in after}
    assert update_difference(noisy, after, before, before)["difference"] <= UPDATE
    assert update_difference(after, after, before, before) == {
        "difference": 0.0,
        "top": [(name, 0.0) for name in list(after)[:3]],
        "whole": 0.0,
        "moved": True,
    }
    # a frozen tensor (one process's update 0) the N ranks moved
    frozen = dict(after) | {"0.bias": before["0.bias"]}
    found = update_difference(after, frozen, before, before)
    assert found["difference"] == float("inf") and found["top"][0][0] == "0.bias"


def test_bf16_parameters_written_as_fp32_are_allowed_a_bf16_ulp_and_no_more():
    """DeepSpeed's bf16 parameters, copied from fp32 masters: the N ranks' copy moved by one bf16
    ulp where one process's, starting from the rounded weight, stayed (the CI failure of
    docs/how-to/bench.md's deepspeed-zero2 row at bf16-mixed).  Two ulps are still a difference."""
    from rankwise.measure.tolerance import update_difference

    before = {"w": torch.full((4,), 0.5).bfloat16().float()}
    ulp = 2.0**-8  # bf16 at 0.5: 8 significant bits
    one = {"w": before["w"] - torch.tensor([ulp, 0.0, ulp, 0.0])}
    many = {"w": before["w"] - torch.tensor([ulp, ulp, ulp, 0.0])}
    assert update_difference(many, one, before, before)["difference"] > 0.5
    assert update_difference(many, one, before, before, held_in=torch.bfloat16)["difference"] == 0
    twice = {"w": before["w"] - torch.tensor([ulp, 2 * ulp, ulp, 0.0])}
    found = update_difference(twice, one, before, before, held_in=torch.bfloat16)
    assert found["difference"] > 0.5
    # an fp32 run is not loosened by a coarser dtype named for it
    assert update_difference(many, one, before, before, held_in=torch.float32)["difference"] > 0.5
