"""The causes a diagnosis names, each worded with what the runs showed and what to change.

:mod:`rankwise.tools.verify.diagnose` decides which apply, most specific first; ``rankwise bench
--script`` words its reasons with the same functions."""

from __future__ import annotations

from rankwise.strategies import lookup
from rankwise.tools.verify.compare import TracedRun
from rankwise.tools.verify.records import StepLine


def batch_dependent(layers: list[str], world_size: int, device: str = "cpu") -> str:
    where = (
        "on these GPUs, torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before rt.prepare "
        "makes the statistics global"
        if device == "cuda"
        else "torch.nn.SyncBatchNorm would make them global on GPUs, but it does not run on the "
        "CPU (it refuses CPU tensors), so on the CPU this model is not equivalent at any rank "
        "count above 1"
    )
    return (
        f"the model has {', '.join(layers)}: each of the {world_size} ranks computes its batch "
        f"statistics over its own share of the global batch, not the whole batch; {where}"
    )


RANDOM_OPS = "the forward drew random numbers"
"""How the finding of random operations begins (the verdict is "not comparable" when it is the only
finding)."""


def random_ops(
    draws: int,
    micro_batches: int,
    dropout_kept: bool,
    world_size: int,
    where: dict[str, int] | None = None,
) -> str:
    source = (
        "dropout modules were kept (--keep-dropout); without the flag verify switches them off"
        if dropout_kept
        else "these are not dropout modules rankwise can switch off: functional dropout "
        "(F.dropout(x, p, training)), attention dropout given as a number, or "
        "torch.rand/randn/bernoulli in forward; make their probability 0 for the comparison (e.g. "
        "a dropout flag of your script)"
    )
    located = f" ({', '.join(sorted(where, key=lambda key: -where[key])[:4])})" if where else ""
    return (
        f"{RANDOM_OPS} in {draws} of {micro_batches} micro-batches of the one-process "
        f"run{located}: each of the {world_size} ranks draws its own numbers for its share of the "
        "batch, so no rank count reproduces one process: not comparable, neither equivalent nor "
        f"not; {source}"
    )


COMPRESSION = {
    "fp16_compress": "rounds every gradient to fp16 (11 significant bits) before the all-reduce",
    "horovod_fp16_compression": "rounds every gradient to fp16 (11 significant bits) before the "
    "allreduce",
    "bf16_compress": "rounds every gradient to bf16 (8 significant bits) before the all-reduce",
    "powersgd": "sends a low-rank approximation of each gradient matrix instead of the gradient",
}


def compressed(hook: str, first: StepLine) -> str:
    what = COMPRESSION.get(hook, "changes the gradients it exchanges")
    how = (
        "Horovod's fp16 compression (DistributedOptimizer(compression=hvd.Compression.fp16))"
        if hook.startswith("horovod")
        else f"DDP's {hook} communication hook (ddp.comm_hook={hook})"
    )
    return (
        f"the gradients were exchanged through {how}, which {what}: at step {first['step']} the "
        "gradient the optimizer received differs from one process's by "
        f"{first['gradient_diff']:.1e} relative. That is the compression working as designed, not "
        "a bug: the run trades exactness for less traffic (rankwise bench states the tolerance it "
        "accepts for it); without it the exchange is exact"
    )


def gradients(first: StepLine, world_size: int) -> str:
    step, difference = first["step"], first["gradient_diff"]
    name = first["gradient_top"][0][0] if first.get("gradient_top") else "?"
    scale = first.get("gradient_scale")
    text = (
        f"at step {step} the samples, the weights before the step and the loss all agree, yet the "
        f"gradient the {world_size} ranks' optimizer received differs from one process's by "
        f"{difference:.1e} relative (most in {name})"
    )
    if first.get("gradient_only_one"):
        return text + (
            f": only one run has a gradient for {', '.join(first['gradient_only_one'][:5])} — "
            "parameters the forward uses on some ranks or steps only"
        )
    if scale is not None and abs(scale - 1) > 0.01:
        hint = {
            world_size: "summed over the ranks instead of averaged",
            1
            / world_size: "averaged over the ranks twice (a loss or gradient divided by the world "
            "size again)",
        }
        guess = next(
            (words for factor, words in hint.items() if abs(scale - factor) < 0.01 * factor), None
        )
        return text + (
            f": it is {scale:.3g} times the one-process gradient"
            + (f" — the gradients were {guess}" if guess else "")
            + ". Leave averaging to the strategy: rt.backward(loss) with the loss a mean over the "
            "global batch, no all_reduce of gradients of your own"
        )
    return text + (
        ": something between the backward pass and the optimizer changed them — a gradient hook "
        "or all_reduce of your own, a gradient modified on one rank, or a custom autograd "
        "function whose backward depends on the batch it sees"
    )


def learning_rates(run: TracedRun, step: int) -> list:
    ranks = run.records.get(step)
    return (ranks[0].get("learning_rates") if ranks else None) or []


def other_learning_rate(
    reference: TracedRun, candidate: TracedRun, first: StepLine, world_size: int
) -> str | None:
    """The optimizer's learning rate differs between the runs at the first differing step (a rate
    scaled by the world size, as Horovod's examples do): a cause of its own, whatever else
    differs."""
    step = first["step"]
    one, many = learning_rates(reference, step), learning_rates(candidate, step)
    if not (one and many and one != many):
        return None
    ratios = {
        round(b / a, 3)
        for a, b in zip(one, many, strict=False)
        if isinstance(a, float) and isinstance(b, float) and a
    }
    scaled = (
        f": {world_size}x, the script scales it by the world size"
        if ratios == {float(world_size)}
        else ""
    )
    return (
        f"the optimizer's learning rate differs at step {step}: one process {one[0]:.3g}, "
        f"{world_size} ranks {many[0]:.3g}{scaled}. The {world_size} ranks already average their "
        "gradients over the global batch, as one process computes it: a larger rate is a change "
        "of the hyper-parameters, not what distributing the same training needs (keep it, or "
        "scale it knowingly, with its warm-up)"
    )


def _moved(first: StepLine) -> str:
    """Which tensor's update differs most, and by how much of itself (a trace line from before
    updates were compared: its largest weight difference)."""
    if first.get("update_top"):
        name, relative = first["update_top"][0]
        return f"{name}'s update by {relative:.1e} of itself"
    name, difference = first["top"][0] if first["top"] else ("?", first["max_param_diff"])
    return f"{name} by {difference:.1e}"


def update(
    reference: TracedRun, candidate: TracedRun, first: StepLine, strategy: str, world_size: int
) -> str:
    moved = _moved(first)
    step = first["step"]
    one, many = learning_rates(reference, step), learning_rates(candidate, step)
    if one and many and one != many:

        def rates(values: list) -> str:
            return ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in values[:4])

        return (
            f"the optimizer stepped with another learning rate at step {step}: one process "
            f"{rates(one)}, {world_size} ranks {rates(many)} (per parameter group), so the weights "
            f"after it differ ({moved}): a learning-rate schedule that does not "
            "drive the optimizer rt.step steps (built on another optimizer object), or one that "
            "depends on the world size"
        )
    if not first.get("followed"):
        if not reference.seen("losses"):
            return (
                f"the weights after step {step} differ ({moved}); the loss was "
                "not recorded (the script does not call rt.backward), so verify cannot tell the "
                "forward from the update"
            )
        return (
            f"the weights after step {step} differ ({moved}) with the loss the "
            "same; the one process could not follow the N-rank run at this step (its gradients "
            "were not recorded), so verify cannot tell the gradient from the update"
        )
    gradient = f"{first['gradient_diff']:.1e}" if first.get("gradient_diff") is not None else "—"
    sharded = candidate.facts.get("shards_optimizer_state", not lookup(strategy).cls.whole_state)
    text = (
        f"step {step} started from the same weights and applied the same gradient (relative "
        f"difference {gradient}), yet the {world_size} ranks' optimizer step moved the weights "
        f"elsewhere than one process's ({moved}): "
    )
    matched = (
        f"the learning rates matched ({', '.join(f'{v:.3g}' for v in one[:4] if v is not None)}); "
        if one and one == many
        else ""
    )
    if sharded:
        return text + (
            f"{matched}{strategy} shards the optimizer state, and its sharded step does not "
            "compute what the whole optimizer does — an optimizer it cannot shard faithfully (one "
            "whose update of a tensor depends on the whole tensor, such as LAMB, Adafactor or "
            "Shampoo), or a step taken on the optimizer directly instead of rt.step"
        )
    if matched:
        return text + (
            f"{matched}the optimizer state or the weights changed outside the step as one process "
            "takes it: a second optimizer.step, weights averaged or edited by hand, or an "
            "optimizer whose step depends on the world size"
        )
    return text + (
        "the optimizer or the learning-rate schedule did not step as in one process — a schedule "
        "stepped per micro-batch or scaled by the world size, a learning rate that depends on the "
        "rank count, or weights changed outside rt.step"
    )


def loss_scaled(first: StepLine, world_size: int, framework: str | None) -> str | None:
    """The loss each rank gave backward, and the gradient, are N (or 1/N) times the one
    process's."""
    one, many, scale = first["loss_reference"], first["loss_candidate"], first.get("gradient_scale")
    if not one or many is None or scale is None:
        return None
    # (clipping may cap a scaled gradient: its factor then lies between 1 and the loss's)
    factor = next(
        (
            f
            for f in (world_size, 1 / world_size)
            if abs(many / one - f) < 0.02 * f
            and (abs(scale - f) < 0.02 * f or 1.01 < scale < f or f < scale < 0.99)
        ),
        None,
    )
    if factor is None:
        return None
    clipped = (
        "" if abs(scale - factor) < 0.02 * factor else ", less where gradient clipping capped it"
    )
    text = (
        f"the loss each rank gave backward at step {first['step']} is {factor:.3g} times the one "
        f"process's ({many:.6g} against {one:.6g}), and the gradient the optimizer received "
        f"{scale:.3g} times its ({factor:.3g}{clipped}): the loss is scaled by the world size on "
        "top of the ranks' gradient averaging"
    )
    if framework == "trainer" and factor == world_size:
        text += (
            ". transformers' Trainer multiplies the loss by the number of processes "
            "(TrainingArguments.average_tokens_across_devices=True, the default) when the model's "
            "forward takes **kwargs, expecting the model's loss to divide by the global "
            "num_items_in_batch; this model's loss is a plain mean over its own batch and ignores "
            "it. Set average_tokens_across_devices=False, or give the model a loss that uses "
            "num_items_in_batch. Adam's update mostly cancels a constant factor, but gradient "
            "clipping (max_grad_norm) and the logged loss do not"
        )
    return text


def normalisation(
    reference: TracedRun, candidate: TracedRun, first: StepLine, world_size: int
) -> str:
    step = first["step"]
    random = (
        "and the forward drew no random numbers"
        if reference.seen("samples")
        else "(random draws unknown: the batches do not come from a DataLoader)"
    )
    text = (
        f"the loss of step {step} differs (one process {first['loss_reference']:.6g}, {world_size} "
        f"ranks {first['loss_candidate']:.6g}) although the weights before it and the samples were "
        f"the same, no layer depends on the batch {random}: the loss is not a mean over the global "
        "batch. A loss averaged over each micro-batch's (or rank's) own tokens weighs a token by "
        "how many others share its micro-batch, so splitting the batch differently changes it"
    )
    one = reference.records[step][0]["tokens"]
    many = [rank["tokens"] for rank in candidate.records[step]]
    if one and len(set(one) | {t for rank in many for t in rank}) > 1:
        per_rank = " | ".join(", ".join(map(str, rank)) for rank in many)
        text += (
            f" (tokens per micro-batch in step {step}: one process {', '.join(map(str, one))}; "
            f"ranks {per_rank})"
        )
    return (
        text
        + ". Count the step's tokens over every micro-batch and rank first (rt.all_reduce(count, "
        "'sum')), then give rt.backward each micro-batch's summed token loss x rt.world_size / "
        "that count (the strategies average gradients over ranks; no further division by the "
        "accumulation), or average per sample"
    )
