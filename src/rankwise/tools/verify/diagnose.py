"""Why N ranks computed something else than one process, from what the two traced runs show.

Each rule looks at evidence the runs recorded (:mod:`rankwise.tools.step_trace`) and, when it
applies, says what it saw and what to change.  The rules run most specific first; the first that
applies is the likeliest cause, the others are listed after it.  ``rankwise bench --script`` words
its reasons with the same functions.
"""

from __future__ import annotations

from rankwise.tools.verify.causes import (
    batch_dependent,
    compressed,
    gradients,
    loss_scaled,
    normalisation,
    other_learning_rate,
    random_ops,
    update,
)
from rankwise.tools.verify.compare import TracedRun
from rankwise.tools.verify.compare import random_ops as located_random_ops
from rankwise.tools.verify.hyperparameter_diff import causes as setting_causes
from rankwise.tools.verify.records import CauseRecord, StepLine, TracedStep
from rankwise.tools.watch.records import FindingRecord

UNUSED_PARAMETER_ERRORS = ("Expected to have finished reduction", "find_unused_parameters")
"""What DDP says when a parameter got no gradient in the previous step."""


def _first_ranks(run: TracedRun) -> list[TracedStep]:
    return [ranks[0] for _, ranks in sorted(run.records.items())]


PLAIN_SCRIPT_WORDS = {
    "before rt.prepare": "before wrapping it",
    "numpy or Python random state rankwise.setup(seed=...) did not reach": "numpy or Python "
    "random state seeded differently",
    "The data loader is not rankwise's rank-sharded one: build it with rt.loader(dataset, "
    "batch_size=GLOBAL), which gives each rank its share of the same global order at any world "
    "size": "The training loader "
    "does not give the ranks together what one process takes: shard it with "
    "DistributedSampler(dataset) (set_epoch each epoch), or let accelerator.prepare / "
    "fabric.setup_dataloaders shard it",
    "a loop over a loader that is not rt.loader's": "a loop over a loader that is not sharded",
    "Leave averaging to the strategy: rt.backward(loss)": "Leave averaging to DDP or FSDP: "
    "loss.backward()",
    "the optimizer rt.step steps": "the optimizer that steps",
    "(the script does not call rt.backward)": "(no backward of a scalar loss was seen)",
    "instead of rt.step": "outside the framework's step",
    "outside rt.step": "outside optimizer.step()",
    "(rt.all_reduce(count, 'sum'))": "(dist.all_reduce(count))",
    "then give rt.backward each micro-batch's summed token loss x rt.world_size / that count (the "
    "strategies": "then backward each micro-batch's summed token loss x the world size / that "
    "count (DDP and FSDP",
}
"""A finding's fix in rankwise's API, and the same fix for a script on torch or its framework."""

CONSEQUENCE = (
    "not-joined",
    "replicas",
    "unsharded",
    "samples",
    "steps",
    "loss-scaled",
    "gradient",
    "scheduler",
    "learning-rate",
    "hyperparameters",
    "half",
    "batch-dependent",
    "random",
    "own-batches",
    "loss-mean",
    "no-grad",
    "comm-hook",
    "update",
)
"""Causes by consequence, gravest first: processes that train alone, replicas that never average
their gradients and ranks that all train on the same data change every step by a whole factor;
another sample, step count, loss or gradient scale, or learning rate changes what is
learnt; 16-bit sums, batch
statistics, random draws and a loss's normalisation move each step by less; a hook's rounding is
the compression working.  A kind not listed comes last."""

PROMOTED = ("not-joined", "replicas")
"""The run's own findings that are a cause of a differing step when they are there (they change
every gradient), so the diagnosis ranks them with the comparison's causes.  (A loader that is not
sharded is one already: the step's samples differ, ``samples``.)"""


def ranked(causes: list[CauseRecord]) -> list[CauseRecord]:
    """``causes`` gravest first (:data:`CONSEQUENCE`), in their order where equally grave."""
    order = {kind: index for index, kind in enumerate(CONSEQUENCE)}
    return sorted(causes, key=lambda cause: order.get(cause["kind"], len(order)))


def diagnose(
    reference: TracedRun,
    candidate: TracedRun,
    lines: list[StepLine],
    first: StepLine | None,
    *,
    strategy: str,
    world_size: int,
    failure: str | None = None,
    steps_asked: int | None = None,
    framework: str | None = None,
    samples: str | None = None,
    run_findings: list[FindingRecord] | None = None,
) -> list[CauseRecord]:
    """Every cause that fits the evidence, gravest first (:func:`ranked`; empty when the runs are
    equivalent): the causes of the first step that differs and those that only a later differing
    step shows, each with the step it first shows in.  ``framework``: the script's, when it is not
    on rankwise.setup() (the fixes are then worded for it); ``samples``: what differs in the data,
    where the runs' records tell (:mod:`rankwise.tools.verify.sample_diff`); ``run_findings``: what
    the N-rank run showed by itself, of which :data:`PROMOTED` are causes of a differing step."""
    shorter = None if failure else _steps_missing(reference, candidate, steps_asked, world_size)
    if first is None and failure is None and not shorter:
        return []
    later = [
        line
        for line in lines
        if first is not None and line["step"] > first["step"] and not line.get("equivalent", True)
    ]
    found: dict[str, str] = {}
    for line in [first, *later]:
        for kind, text in _diagnose(
            reference,
            candidate,
            line,
            strategy=strategy,
            world_size=world_size,
            failure=failure,
            framework=framework,
            samples=samples,
        ):
            if kind not in found:
                shows_later = (
                    line is not None and first is not None and line["step"] != first["step"]
                )
                found[kind] = text + (
                    f" (first shows at step {line['step']})" if shows_later and line else ""
                )
    causes = [
        CauseRecord(kind=kind, text=text)
        for kind, text in [*([("steps", shorter)] if shorter else []), *found.items()]
    ]
    if first is not None:
        causes += [
            CauseRecord(kind=finding["kind"], text=finding["text"])
            for finding in run_findings or []
            if finding["level"] == "error" and finding["kind"] in PROMOTED
        ]
    if framework:
        for ours, theirs in PLAIN_SCRIPT_WORDS.items():
            causes = [cause | {"text": cause["text"].replace(ours, theirs)} for cause in causes]
    return ranked(causes)


def _diagnose(
    reference: TracedRun,
    candidate: TracedRun,
    first: StepLine | None,
    *,
    strategy: str,
    world_size: int,
    failure: str | None,
    framework: str | None,
    samples: str | None,
) -> list[tuple[str, str]]:
    """The causes that fit one differing step (``first``; ``None``: a run failed), as ``(kind,
    text)``."""
    findings: list[tuple[str, str]] = []
    records = _first_ranks(reference)
    no_grad = sorted({name for record in records for name in record["no_grad"]})
    if failure and no_grad:
        names = ", ".join(no_grad[:5])
        if any(words in failure for words in UNUSED_PARAMETER_ERRORS):
            findings.append(
                (
                    "no-grad",
                    f"parameters {names} got no gradient in the one-process run; DDP waits for "
                    "every parameter's gradient before it averages a bucket, so the run failed at "
                    "the next step: freeze them (requires_grad=False) if they should not train, "
                    "else --set ddp.find_unused_parameters=true",
                )
            )
        else:
            findings.append(
                (
                    "no-grad",
                    f"parameters {names} got no gradient in the one-process run: a strategy that "
                    "reduces gradients in buckets may wait for them; freeze them if they should "
                    "not train",
                )
            )
    if first is not None and first["data"] == "made":
        findings.append(
            (
                "own-batches",
                f"step {first['step']}'s batches are not the same: {first['data_detail']}. Each "
                "run draws or slices its own (a generator seeded per rank, unseeded random data, "
                "offsets of its own), so no one-process run takes the N ranks' global batch, and "
                "their steps differ by their data: not comparable, neither equivalent nor not. "
                "Feed the batches from a DataLoader (verify then gives the one process the ranks' "
                "samples), or make them the same at any world size",
            )
        )
    if first is not None and first["data"] in ("differs", "unmatched"):
        findings.append(
            (
                "samples",
                f"step {first['step']}'s samples differ: {first['data_detail']}. "
                + (
                    samples
                    or "The data loader is not rankwise's rank-sharded one: build it with "
                    "rt.loader(dataset, batch_size=GLOBAL), which gives each rank its share of "
                    "the same global order at any world size"
                ),
            )
        )
    layers = candidate.facts.get("batch_dependent") or reference.facts.get("batch_dependent") or []
    if layers:
        findings.append(
            (
                "batch-dependent",
                batch_dependent(layers, world_size, candidate.facts.get("device", "cpu")),
            )
        )
    draws, micro = sum(r["random_draws"] for r in records), sum(len(r["losses"]) for r in records)
    if draws:
        findings.append(
            (
                "random",
                random_ops(
                    draws,
                    micro,
                    bool(reference.facts.get("dropout_kept")),
                    world_size,
                    located_random_ops(reference),
                ),
            )
        )
    half = candidate.facts.get("half_params") or reference.facts.get("half_params")
    if half:
        fix = (
            'turn the DeepSpeed config\'s "bf16"/"fp16" off (fp32 parameters, which its fp32 '
            "gradients follow) and compute in 16 bits under torch.autocast"
            if candidate.facts.get("api") == "deepspeed"
            else "keep fp32 parameters and compute in 16 bits with --precision bf16-mixed "
            "(autocast), whose gradients accumulate in fp32"
        )
        findings.append(
            (
                "half",
                f"the trainable parameters are {', '.join(half)}, and so are their gradients: "
                "accumulating micro-batches and averaging ranks round at every addition, in "
                f"another order on {world_size} ranks than in one process; {fix}",
            )
        )
    loss_differs = first is not None and first["step"] and not first["loss_ok"]
    scaled = (
        loss_scaled(first, world_size, framework) if loss_differs and first is not None else None
    )
    # (its evidence is its own — the loss N times one process's —, whatever else the model holds)
    if scaled:
        findings.append(("loss-scaled", scaled))
    elif loss_differs and not findings and first is not None:
        findings.append(("loss-mean", normalisation(reference, candidate, first, world_size)))
    if no_grad and not failure:
        findings.append(
            (
                "no-grad",
                f"parameters {', '.join(no_grad[:5])} got no gradient in the one-process run",
            )
        )
    hook = str(candidate.facts.get("comm_hook", "none"))
    if (
        first is not None
        and first["step"]
        and not first.get("gradient_ok", True)
        and hook != "none"
    ):
        # The hook explains a gradient that is the exact one rounded, not one that is another
        # multiple or another sample's: then it is only listed after what does explain it.
        alone = not findings and abs((first.get("gradient_scale") or 1.0) - 1) < 0.01
        findings.insert(0 if alone else len(findings), ("comm-hook", compressed(hook, first)))
    # The optimizer's settings, compared exactly (a trace from before they were recorded: its
    # learning rates alone)
    settings = setting_causes(reference, candidate, first, world_size, framework) if first else []
    rates = (
        other_learning_rate(reference, candidate, first, world_size)
        if first is not None and not settings
        else None
    )
    if first is not None and not findings:
        if not first.get("gradient_ok", True):
            findings.append(("gradient", gradients(first, world_size)))
        elif (
            settings
        ):  # (what the optimizer was told to do differs: that is why it moved elsewhere)
            findings += settings
            settings = []
        else:  # (the update's finding names another learning rate itself: one cause, listed once)
            findings.append(
                (
                    "learning-rate" if rates else "update",
                    update(reference, candidate, first, strategy, world_size),
                )
            )
            rates = None
    findings += settings
    if rates:
        findings.append(("learning-rate", rates))
    return findings


def _steps_missing(
    reference: TracedRun, candidate: TracedRun, asked: int | None, world_size: int
) -> str | None:
    if reference.reached == candidate.reached:
        return None
    return (
        f"the {world_size}-rank run recorded {candidate.reached} optimizer steps, the one process "
        f"{reference.reached} (of {asked} asked): the script's loop does not run the same steps at "
        "every world size (a step count computed from the per-rank batch, or a loop over a loader "
        "that is not rt.loader's)"
    )
