"""What a watched N-rank run shows by itself, without a reference: each finding with what was
observed and the fix.

Read from every rank's record (:func:`rankwise.tools.watch.seen.of`).  A finding is an ``error``
when it changes what the script computes or reports (exit 1), a ``warning`` when it costs speed or
portability.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rankwise.tools.watch.loaders import RANK_RECORD
from rankwise.tools.watch.records import CallSiteRecord, FindingRecord, PassRecord, RankRecord


@dataclass(frozen=True)
class Finding:
    level: str
    """``error`` (changes results: exit 1) or ``warning``."""
    kind: str
    """What was found, as a word a program can match (``replicas``, ``unsharded``, ...: the list in
    docs/how-to/verify.md, "What verify names")."""
    text: str

    def as_dict(self) -> FindingRecord:
        return {"level": self.level, "kind": self.kind, "text": self.text}


def load_records(directory: Path) -> list[RankRecord]:
    records = [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(directory.glob(RANK_RECORD.format(rank="*")))
    ]
    return sorted(records, key=lambda record: record["rank"])


def findings(records: list[RankRecord], processes: int) -> list[Finding]:
    """Every finding, errors first."""
    if not records:
        return []
    found = [
        *_not_joined(records, processes),
        *_unsharded(records),
        *_epochs(records),
        *_evaluation(records),
        *_replicas(records),
        *_summed_loss(records),
        *_per_rank_metrics(records),
        *_saves(records),
        *_sync_points(records),
    ]
    return sorted(found, key=lambda finding: finding.level != "error")


def _not_joined(records: list[RankRecord], processes: int) -> list[Finding]:
    alone = [r for r in records if r["world_size"] == 1 or r.get("framework_world_size") == 1]
    if processes < 2 or not alone:
        return []
    seen = (
        "Accelerate's num_processes 1"
        if any(r.get("framework_world_size") == 1 for r in alone)
        else "torch.distributed not initialised"
    )
    return [
        Finding(
            "error",
            "not-joined",
            f"{len(alone)} of the {processes} processes never joined a process group ({seen}): "
            "every one trained alone on all the data, as many separate single-process "
            "runs. An Accelerate script on a machine without a GPU joins only in Accelerate's CPU "
            "mode: start it with `accelerate launch --cpu`, or ACCELERATE_USE_CPU=true, or "
            "Accelerator(cpu=True); a torch script must call dist.init_process_group()",
        )
    ]


def _training_passes(record: RankRecord) -> list[PassRecord]:
    return [p for p in record["passes"] if p["trained"]]


def _unsharded(records: list[RankRecord]) -> list[Finding]:
    if len(records) < 2:
        return []
    firsts = [next((p["first"] for p in _training_passes(r) if p["first"]), None) for r in records]
    if firsts[0] is None and not any(_training_passes(r) for r in records):
        return _same_inputs(records)
    if firsts[0] is None or any(first != firsts[0] for first in firsts[1:]):
        return []
    passes = _training_passes(records[0])
    sampler = passes[0]["sampler"] if passes else None
    return [
        Finding(
            "error",
            "unsharded",
            f"every one of the {len(records)} ranks trained on the same samples (the first "
            f"{len(firsts[0])} samples are the same on every rank): the training loader is "
            f"not sharded (its sampler: {sampler}), so each rank trains on all the data and the "
            "global batch holds every sample N times. Give the training DataLoader "
            "sampler=DistributedSampler(dataset) (or let accelerator.prepare / fabric."
            "setup_dataloaders shard it)",
        )
    ]


def _same_inputs(records: list[RankRecord]) -> list[Finding]:
    """A script that makes its own batches (no DataLoader): every rank's first training inputs the
    same rows."""
    firsts = [r.get("first_inputs") or [] for r in records]
    if not firsts[0] or any(first != firsts[0] for first in firsts[1:]):
        return []
    return [
        Finding(
            "error",
            "unsharded",
            f"every one of the {len(records)} ranks trained on the same inputs (the first "
            f"{len(firsts[0])} rows of the model's first training input are the same on every "
            "rank; the script makes its batches itself, without a DataLoader): each rank does the "
            "same work, and the global batch holds every sample N times. Draw or slice each "
            "rank's batch by its rank (a generator seeded with the rank, or indices offset by it), "
            "or feed it from a DataLoader with a DistributedSampler",
        )
    ]


def _epochs(records: list[RankRecord]) -> list[Finding]:
    record = records[0]
    passes = [p for p in _training_passes(record) if p["distributed_sampler"] and p["shuffle"]]
    by_loader = defaultdict(list)
    for p in passes:
        by_loader[p["loader"]].append(p)
    for loader_passes in by_loader.values():
        if len(loader_passes) < 2 or record["set_epoch_calls"]:
            continue
        epochs = {p["epoch"] for p in loader_passes}
        same = all(p["first"][:4] == loader_passes[0]["first"][:4] for p in loader_passes[1:])
        if len(epochs) == 1 and same:
            fix = (
                "rt.set_epoch(loader, epoch)"
                if record.get("api") == "rankwise"
                else "sampler.set_epoch(epoch)"
            )
            return [
                Finding(
                    "error",
                    "epochs",
                    f"the training loader's DistributedSampler shuffles, but set_epoch was never "
                    f"called: its {len(loader_passes)} passes all began with the same samples "
                    f"(epoch {next(iter(epochs))} each time), so every epoch repeats one order. "
                    f"Call {fix} before each epoch's loop",
                )
            ]
    return []


def _evaluation(records: list[RankRecord]) -> list[Finding]:
    """Each evaluation pass (one that ran whole and trained nothing) counted exactly once: not more
    often (each rank evaluating the whole set, or padding), and not less (one rank's shard taken for
    the whole set)."""
    return [*_counted_more(records), *_counted_less(records)]


def _counted_less(records: list[RankRecord]) -> list[Finding]:
    for record in records:
        for p in evaluations(record):
            size = p["dataset_size"]
            if size is None or p["samples"] >= size or not p["distributed_sampler"] or _combined(p):
                continue
            return [
                Finding(
                    "error",
                    # (a metric of one rank's shard taken for the set's: what per-rank-metric means)
                    "per-rank-metric",
                    f"rank {record['rank']} evaluated {p['samples']} of the {size} samples of "
                    f"loader {p['loader']} (its DistributedSampler's shard) and nothing was "
                    "combined across the ranks after it (no collective from the script before its "
                    "next pass): a metric computed from it describes one rank's shard, not the "
                    "set. Sum the counts over the ranks (dist.all_reduce of correct and total) or "
                    "gather the predictions before computing it; or evaluate the whole set on one "
                    "rank without a DistributedSampler",
                )
            ]
    return []


def evaluations(record: RankRecord) -> list[PassRecord]:
    """A rank's evaluation passes: those that ran whole and trained nothing."""
    return [p for p in record["passes"] if not p["trained"] and p["complete"]]


def _counted_more(records: list[RankRecord]) -> list[Finding]:
    count = min(len(evaluations(r)) for r in records)
    for index in range(count):
        passes = [evaluations(r)[index] for r in records]
        size, seen = passes[0]["dataset_size"], sum(p["samples"] for p in passes)
        if size is None or seen <= size or any(p.get("deduplicated_after") for p in passes):
            continue  # (gather_for_metrics, or rankwise's exact gather, dropped the repeats)
        if any(seen - (p.get("trimmed_after") or 0) == size for p in passes):
            continue  # (the script cut them off what it gathered, as many as there were)
        whole = all(p["samples"] == size for p in passes) and len(records) > 1
        if not _combined(passes[0]):  # each rank's result stays its own: nothing was counted twice
            if whole:
                return [
                    Finding(
                        "warning",
                        "evaluated-whole",
                        f"each of the {len(records)} ranks evaluated the whole {size}-sample set "
                        f"of loader {passes[0]['loader']} (nothing combined after it): the same "
                        f"work {len(records)} times. Shard it with a DistributedSampler and "
                        "combine the counts once, or evaluate on rank 0 only",
                    )
                ]
            continue
        if whole:
            why = (
                f"each of the {len(records)} ranks evaluated the whole set; shard it with a "
                "DistributedSampler (and gather once), or evaluate on rank 0 only"
            )
        elif passes[0]["distributed_sampler"]:
            why = (
                f"the DistributedSampler pads {seen - size} samples so {size} divides by "
                f"{len(records)} ranks: those are counted twice. Gather the predictions with their "
                "sample indices and drop the repeats (accelerator.gather_for_metrics does), or "
                "evaluate on one device (Lightning's advice)"
            )
        else:
            why = "some samples were evaluated on more than one rank"
        return [
            Finding(
                "error",
                "counted-more",
                f"evaluation counted {seen} predictions over the {len(records)} ranks for a "
                f"{size}-sample set (loader {passes[0]['loader']}): {why}",
            )
        ]
    return []


def _combined(evaluation: PassRecord) -> bool:
    """Whether the script combined something across the ranks after an evaluation pass (unknown:
    assumed so)."""
    after = evaluation.get("collectives_after")
    return after is None or after > 0


def _summed_loss(records: list[RankRecord]) -> list[Finding]:
    summed = next((r.get("summed_loss") for r in records if r.get("summed_loss")), None)
    world = max(r["world_size"] for r in records)
    if not summed or world < 2:
        return []
    return [
        Finding(
            "error",
            "loss-mean",
            f"the loss each rank gave backward is a sum over its batch ({summed}), not a mean: "
            f"the {world} ranks' gradients are averaged, so each step is 1/{world} of the one "
            "process's, which sums over the same global batch. Average over the batch (the "
            'criterion\'s default reduction="mean", or .mean()), or divide the sum by the '
            "samples (or tokens) of the global batch and multiply by the world size",
        )
    ]


def _replicas(records: list[RankRecord]) -> list[Finding]:
    steps = sorted({step for r in records for step in r["replicas_differ"]})
    if not steps:
        return []
    return [
        Finding(
            "error",
            "replicas",
            f"the ranks' replicas held different weights after step {steps[0]} (digests compared "
            "across ranks): the gradients were not averaged before the step (a model not wrapped "
            "in DDP, or a step taken under no_sync), or ranks started from different weights",
        )
    ]


def _per_rank_metrics(records: list[RankRecord]) -> list[Finding]:
    """Metrics one rank reported from its own shard (:mod:`rankwise.tools.watch.shard_metrics`)."""
    if len(records) < 2:
        return []
    out = []
    metrics = [record.get("metrics") for record in records]
    logs = {name: site for m in metrics if m for name, site in m["unsynced_logs"].items()}
    if logs:
        name, site = next(iter(logs.items()))
        out.append(
            Finding(
                "error",
                "per-rank-metric",
                f"self.log({name!r}, ...) at {site} logs at epoch level without sync_dist=True"
                + (
                    f" (and {len(logs) - 1} more: {', '.join(list(logs)[1:4])})"
                    if len(logs) > 1
                    else ""
                )
                + f": each of the {len(records)} ranks averages its own shard, and the loggers, "
                "the progress bar and a ModelCheckpoint monitoring it read rank 0's. Log it with "
                "sync_dist=True, or log a torchmetrics Metric object (it syncs itself)",
            )
        )
    unsynced = {name: site for m in metrics if m for name, site in m["unsynced_metrics"].items()}
    if unsynced:
        name, site = next(iter(unsynced.items()))
        out.append(
            Finding(
                "error",
                "per-rank-metric",
                f"the torchmetrics {name} computed at {site} was built with "
                f"sync_on_compute=False: its states are never gathered over the {len(records)} "
                "ranks, so its value is each rank's shard's. Leave sync_on_compute at its default "
                "(True)",
            )
        )
    prints = [m.get("loss_prints", {}) if m else {} for m in metrics]
    everywhere = [site for site in prints[0] if all(other.get(site) for other in prints[1:])]
    if everywhere:
        out.append(
            Finding(
                "error",
                "per-rank-metric",
                f"every one of the {len(records)} ranks prints its own training loss at "
                f"{everywhere[0]}, never reduced across them: {len(records)} lines for one step, "
                f"each the loss of one rank's 1/{len(records)} of the global batch, none the "
                "step's loss one process prints. Average a detached copy over the ranks first "
                "(dist.all_reduce with op=AVG; hvd.allreduce; fabric.all_reduce) and print it on "
                "rank 0",
            )
        )
    reads = [m["loss_reads"] if m else {} for m in metrics]
    alone = [
        f"reads the training loss at {site}"
        for site in reads[0]
        if any(not other.get(site) for other in reads[1:])
    ]
    printed = metrics[0].get("printed_losses", {}) if metrics[0] else {}
    alone += [
        f"prints the training loss (fabric.print at {site}: Fabric prints rank 0's line only)"
        for site in printed
    ]
    alone += [
        f"prints the training loss at {site}"
        for site in prints[0]
        if site not in everywhere and any(not other.get(site) for other in prints[1:])
    ]
    if alone:
        out.append(
            Finding(
                "warning",
                "per-rank-metric",
                f"rank 0 alone {alone[0]}, never reduced across the "
                f"{len(records)} ranks: it is the loss of rank 0's 1/{len(records)} of the global "
                "batch, not the step's. Average a detached copy over the ranks first "
                "(dist.all_reduce with op=AVG; hvd.allreduce), or label it as rank 0's",
            )
        )
    return out


def _saves(records: list[RankRecord]) -> list[Finding]:
    out = []
    writers = defaultdict(set)
    for r in records:
        for save in r["saves"]:
            writers[save["path"]].add(r["rank"])
    shared = [path for path, ranks in writers.items() if len(ranks) > 1]
    if shared:
        out.append(
            Finding(
                "warning",
                "shared-save",
                f"{len(writers[shared[0]])} ranks wrote one checkpoint file ({shared[0]}): "
                "they race, and a reader may find it half-written. Save on rank 0 only "
                "(if dist.get_rank() == 0), after a barrier",
            )
        )
    prefixed = next((save for r in records for save in r["saves"] if save["module_prefix"]), None)
    if prefixed:
        out.append(
            Finding(
                "warning",
                "module-prefix",
                f"the checkpoint saved at {prefixed['site']} has keys starting with "
                "'module.' (DDP's wrapper): it loads only into a DDP-wrapped model. Save "
                "model.module.state_dict() (or accelerator.unwrap_model(model))",
            )
        )
    return out


def _every_step(
    record: RankRecord, sites: dict[str, CallSiteRecord]
) -> list[tuple[str, CallSiteRecord, float]]:
    """The call sites in ``sites`` that ran in every step (the first may be warm-up; a call seen in
    one step only is no pattern), with their share of the step time, costliest first."""
    steps = record["steps"]
    if steps < 2:
        return []
    total = sum(record["step_seconds"]) or 1.0
    return [
        (site, entry, entry["seconds"] / total)
        for site, entry in sorted(sites.items(), key=lambda item: -item[1]["seconds"])
        if entry["steps"] >= max(2, steps - 1) and entry["calls"] >= steps - 1
    ]


def _sync_points(records: list[RankRecord]) -> list[Finding]:
    record, out = records[0], []
    steps = record["steps"]
    for site, entry, share in _every_step(record, record["collectives"]):
        head = (
            f"{site} runs every step ({entry['calls']} calls in {steps} steps), {share:.1%} of the "
            "step time on rank 0: every rank waits for the slowest there"
        )
        if "(via " in site:  # the framework's own, made from the script's call
            out.append(
                Finding(
                    "warning",
                    "sync-point",
                    f"{head}. The framework makes this call itself each step (such as a count "
                    "gathered to normalise the loss); its settings may avoid it",
                )
            )
        else:
            out.append(
                Finding(
                    "warning",
                    "sync-point",
                    f"{head}. A barrier is not needed between steps (DDP and FSDP already "
                    "synchronise the gradients); a value reduced only for logging can be reduced "
                    "every N steps; a count the loss needs (its tokens over the ranks) is worth "
                    "its cost",
                )
            )
    on_gpu = record.get("device") == "cuda"
    for site, entry, share in _every_step(record, record.get("reads", {})):
        cost = (
            f"{share:.1%} of the step time on rank 0"
            if on_gpu
            else f"{share:.1%} of the step time here, on the CPU, where it costs nothing; on a GPU "
            "each call waits for the device"
        )
        out.append(
            Finding(
                "warning",
                "host-read",
                f"{site} runs every step ({entry['calls']} calls in {steps} steps), {cost}: "
                "the CPU cannot queue the next step's work until the device has finished "
                "this one's. Read the value every N steps, or add it up on the device "
                "(total += loss.detach()) and read it once",
            )
        )
    return out
