"""Why N ranks computed something else than one process, from what the two traced runs show.

Each rule looks at evidence the runs recorded (:mod:`rankwise.trace`, :mod:`rankwise.probe`) and,
when it applies, says what it saw and what to change.  The rules run most specific first; the
first that applies is the likeliest cause, the others are listed after it.  ``rankwise bench
--script`` words its reasons with the same functions.
"""

from __future__ import annotations

from rankwise.tools.verify.compare import TracedRun


def batch_dependent(layers: list[str], world_size: int, device: str = "cpu") -> str:
    where = ("on these GPUs, torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before rt.prepare makes the "
             "statistics global" if device == "cuda" else
             "torch.nn.SyncBatchNorm would make them global on GPUs, but it does not run on the CPU (it refuses "
             "CPU tensors), so on the CPU this model is not equivalent at any rank count above 1")
    return (f"the model has {', '.join(layers)}: each of the {world_size} ranks normalises over its own share of the "
            f"global batch, not the whole batch; {where}")


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
             world_size: int, failure: str | None = None) -> list[str]:
    """Causes that fit the evidence, likeliest first (empty when the runs are equivalent)."""
    if first is None and failure is None:
        return []
    findings = []
    no_grad = sorted({name for record in _first_ranks(reference) for name in record["no_grad"]})
    if failure and no_grad:
        hint = ("--set ddp.find_unused_parameters=true" if strategy.startswith("ddp") else
                "a strategy option that tolerates them")
        findings.append(f"parameters {', '.join(no_grad[:5])} got no gradient in the one-process run; {strategy} "
                        "waits for every parameter's gradient before it averages a bucket, so the run fails at the "
                        f"next step: freeze them (requires_grad=False) if they should not train, else {hint}")
    if first is not None and first["step"] == 0:
        same = candidate.facts.get("ranks_built_same_weights", True)
        findings.append("the runs start from different weights: the model is built from random numbers drawn before "
                        "rankwise.setup() seeded them (build it inside `with rankwise.setup(seed=...)`), or the script "
                        "seeds per rank" + ("" if same else f"; the {world_size} ranks also built different weights"))
    if first is not None and first["data"] == "differs":
        loader = "" if candidate.probe.get("samples_per_step", 1) else " (the script never called rt.loader)"
        findings.append(f"step {first['step']}'s samples differ: {first['data_detail']}{loader}. The data loader "
                        "is not rankwise's rank-sharded one: build it with rt.loader(dataset, batch_size=GLOBAL), "
                        "which gives each rank its share of the same global order at any world size")
    layers = candidate.probe.get("model", {}).get("batch_dependent") or []
    if layers:
        findings.append(batch_dependent(layers, world_size, candidate.probe.get("device", "cpu")))
    records = _first_ranks(reference)
    draws, micro = sum(r["random_draws"] for r in records), sum(len(r["losses"]) for r in records)
    if draws:
        findings.append(random_ops(draws, micro, bool(reference.facts.get("dropout_kept")), world_size))
    half = candidate.facts.get("half_params") or reference.facts.get("half_params")
    if half:
        findings.append(f"the trainable parameters are {', '.join(half)}, and so are their gradients: accumulating "
                        "micro-batches and averaging ranks round at every addition, in another order on "
                        f"{world_size} ranks than in one process; keep fp32 parameters and compute in 16 bits with "
                        "--precision bf16-mixed (autocast), whose gradients accumulate in fp32")
    if first is not None and first["step"] and not first["loss_ok"] and not (layers or draws) \
            and first["data"] != "differs":
        findings.append(_normalisation(reference, candidate, first, world_size))
    if no_grad and not failure:
        findings.append(f"parameters {', '.join(no_grad[:5])} got no gradient in the one-process run")
    if not findings and first is not None:
        name, difference = first["top"][0] if first["top"] else ("?", first["max_param_diff"])
        findings.append(f"the loss of step {first['step']} matched but the weights after it did not ({name} by "
                        f"{difference:.1e}): the gradients were combined or applied differently — a compressed "
                        "gradient exchange, or an optimizer that does not step the same when its state is sharded")
    return findings


def _normalisation(reference: TracedRun, candidate: TracedRun, first: dict, world_size: int) -> str:
    step = first["step"]
    text = (f"the loss of step {step} differs (one process {first['loss_reference']:.6g}, {world_size} ranks "
            f"{first['loss_candidate']:.6g}) although the weights before it and the samples were the same and nothing "
            "in the model depends on the batch or on random numbers: the loss is not a mean over the global batch. "
            "A loss averaged over each micro-batch's (or rank's) own tokens weighs a token by how many others share "
            "its micro-batch, so splitting the batch differently changes it")
    one = reference.records[step][0]["tokens"]
    many = [rank["tokens"] for rank in candidate.records[step]]
    if one and len(set(one) | {t for rank in many for t in rank}) > 1:
        per_rank = " | ".join(", ".join(map(str, rank)) for rank in many)
        text += f" (tokens per micro-batch in step {step}: one process {', '.join(map(str, one))}; ranks {per_rank})"
    return (text + ". Sum the per-token losses and divide by the step's token count over every micro-batch and rank "
            "(count them, then rt.all_reduce(count, 'sum')), or average per sample")
