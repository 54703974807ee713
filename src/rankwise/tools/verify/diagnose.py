"""Why N ranks computed something else than one process, from what the two traced runs show.

Each rule looks at evidence the runs recorded (:mod:`rankwise.trace`) and, when it applies, says
what it saw and what to change.  The rules run most specific first; the first that applies is
the likeliest cause, the others are listed after it.  ``rankwise bench --script`` words its
reasons with the same functions.
"""

from __future__ import annotations

from rankwise.tools.verify.compare import TracedRun

UNUSED_PARAMETER_ERRORS = ("Expected to have finished reduction", "find_unused_parameters")
"""What DDP says when a parameter got no gradient in the previous step."""


def batch_dependent(layers: list[str], world_size: int, device: str = "cpu") -> str:
    where = ("on these GPUs, torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before rt.prepare makes the "
             "statistics global" if device == "cuda" else
             "torch.nn.SyncBatchNorm would make them global on GPUs, but it does not run on the CPU (it refuses "
             "CPU tensors), so on the CPU this model is not equivalent at any rank count above 1")
    return (f"the model has {', '.join(layers)}: each of the {world_size} ranks computes its batch statistics over "
            f"its own share of the global batch, not the whole batch; {where}")


def random_ops(draws: int, micro_batches: int, dropout_kept: bool, world_size: int) -> str:
    source = ("dropout modules were kept (--keep-dropout); without the flag verify switches them off" if dropout_kept
              else "these are not dropout modules rankwise can switch off: functional dropout (F.dropout(x, p, "
              "training)), attention dropout given as a number, or torch.rand/randn/bernoulli in forward; make "
              "their probability 0 for the comparison (e.g. a dropout flag of your script)")
    return (f"the forward drew random numbers in {draws} of {micro_batches} micro-batches of the one-process run: "
            f"each of the {world_size} ranks draws its own numbers for its share of the batch, so no rank count "
            f"reproduces one process; {source}")


def _first_ranks(run: TracedRun) -> list[dict]:
    return [ranks[0] for _, ranks in sorted(run.records.items())]


def diagnose(reference: TracedRun, candidate: TracedRun, lines: list[dict], first: dict | None, *, strategy: str,
             world_size: int, failure: str | None = None, steps_asked: int | None = None) -> list[str]:
    """Causes that fit the evidence, likeliest first (empty when the runs are equivalent)."""
    shorter = None if failure else _steps_missing(reference, candidate, steps_asked, world_size)
    if first is None and failure is None and not shorter:
        return []
    findings = []
    records = _first_ranks(reference)
    no_grad = sorted({name for record in records for name in record["no_grad"]})
    if failure and no_grad:
        names = ", ".join(no_grad[:5])
        if any(words in failure for words in UNUSED_PARAMETER_ERRORS):
            findings.append(f"parameters {names} got no gradient in the one-process run; DDP waits for every "
                            "parameter's gradient before it averages a bucket, so the run failed at the next step: "
                            "freeze them (requires_grad=False) if they should not train, else "
                            "--set ddp.find_unused_parameters=true")
        else:
            findings.append(f"parameters {names} got no gradient in the one-process run: a strategy that reduces "
                            "gradients in buckets may wait for them; freeze them if they should not train")
    if not candidate.facts.get("ranks_built_same_weights", True):
        findings.append(f"the {world_size} ranks built different initial weights: DDP starts every rank from rank "
                        "0's copy, but a sharding strategy starts each rank from its own share; build the model the "
                        "same way on every rank, after rankwise.setup(seed=...) has seeded them alike")
    if first is not None and first["step"] == 0:
        findings.append("the runs start from different weights: the model's initialisation depends on the run — a "
                        "seed set per rank or from the clock, numpy or Python random state rankwise.setup(seed=...) "
                        "did not reach, or code that reads the rank or world size before the model is built")
    if first is not None and first["data"] in ("differs", "unmatched"):
        findings.append(f"step {first['step']}'s samples differ: {first['data_detail']}. The data loader is not "
                        "rankwise's rank-sharded one: build it with rt.loader(dataset, batch_size=GLOBAL), which "
                        "gives each rank its share of the same global order at any world size")
    layers = candidate.facts.get("batch_dependent") or reference.facts.get("batch_dependent") or []
    if layers:
        findings.append(batch_dependent(layers, world_size, candidate.facts.get("device", "cpu")))
    draws, micro = sum(r["random_draws"] for r in records), sum(len(r["losses"]) for r in records)
    if draws:
        findings.append(random_ops(draws, micro, bool(reference.facts.get("dropout_kept")), world_size))
    half = candidate.facts.get("half_params") or reference.facts.get("half_params")
    if half:
        findings.append(f"the trainable parameters are {', '.join(half)}, and so are their gradients: accumulating "
                        "micro-batches and averaging ranks round at every addition, in another order on "
                        f"{world_size} ranks than in one process; keep fp32 parameters and compute in 16 bits with "
                        "--precision bf16-mixed (autocast), whose gradients accumulate in fp32")
    if first is not None and first["step"] and not first["loss_ok"] and not findings:
        findings.append(_normalisation(reference, candidate, first, world_size))
    if no_grad and not failure:
        findings.append(f"parameters {', '.join(no_grad[:5])} got no gradient in the one-process run")
    if first is not None and not findings:
        findings.append(_weights_only(reference, first))
    return ([shorter] if shorter else []) + findings


def _steps_missing(reference: TracedRun, candidate: TracedRun, asked: int | None, world_size: int) -> str | None:
    if reference.reached == candidate.reached:
        return None
    return (f"the {world_size}-rank run recorded {candidate.reached} optimizer steps, the one process "
            f"{reference.reached} (of {asked} asked): the script's loop does not run the same steps at every world "
            "size (a step count computed from the per-rank batch, or a loop over a loader that is not rt.loader's)")


def _weights_only(reference: TracedRun, first: dict) -> str:
    name, difference = first["top"][0] if first["top"] else ("?", first["max_param_diff"])
    if not reference.seen("losses"):
        return (f"the weights after step {first['step']} differ ({name} by {difference:.1e}); the loss was not "
                "recorded (the script does not call rt.backward), so verify cannot tell the forward from the update")
    return (f"the loss of step {first['step']} matched but the weights after it did not ({name} by "
            f"{difference:.1e}): the gradients were combined or applied differently — a compressed gradient "
            "exchange, or an optimizer that does not step the same when its state is sharded")


def _normalisation(reference: TracedRun, candidate: TracedRun, first: dict, world_size: int) -> str:
    step = first["step"]
    random = ("and the forward drew no random numbers" if reference.seen("samples") else
              "(random draws unknown: the batches do not go through rt.to_device)")
    text = (f"the loss of step {step} differs (one process {first['loss_reference']:.6g}, {world_size} ranks "
            f"{first['loss_candidate']:.6g}) although the weights before it and the samples were the same, no layer "
            f"depends on the batch {random}: the loss is not a mean over the global batch. A loss averaged over "
            "each micro-batch's (or rank's) own tokens weighs a token by how many others share its micro-batch, so "
            "splitting the batch differently changes it")
    one = reference.records[step][0]["tokens"]
    many = [rank["tokens"] for rank in candidate.records[step]]
    if one and len(set(one) | {t for rank in many for t in rank}) > 1:
        per_rank = " | ".join(", ".join(map(str, rank)) for rank in many)
        text += f" (tokens per micro-batch in step {step}: one process {', '.join(map(str, one))}; ranks {per_rank})"
    return (text + ". Count the step's tokens over every micro-batch and rank first (rt.all_reduce(count, 'sum')), "
            "then give rt.backward each micro-batch's summed token loss x rt.world_size / that count (the strategies "
            "average gradients over ranks; no further division by the accumulation), or average per sample")
