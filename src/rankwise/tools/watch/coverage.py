"""What of the script a watched N-rank run reached, and which of the findings' checks that let run.

A finding that needs no reference can only fire on what ran: ``set_epoch`` needs a second pass of a
shuffling training loader, the evaluation count a whole evaluation pass, the checkpoint checks a
save.  So the report lists the parts of the script that ran (epochs entered, how they were
shortened, evaluation passes, saves, shutdown), read from rank 0's record
(:func:`rankwise.tools.watch.seen.of`), and every check with what it covered or why it could not
run.
"""

from __future__ import annotations

from collections import defaultdict

from rankwise.tools.watch.findings import evaluations
from rankwise.tools.watch.records import PassRecord, RankRecord


def parts_ran(record: RankRecord) -> list[str]:
    """The parts of the script the run reached, in words, one per line."""
    trained: defaultdict[int, list[PassRecord]] = defaultdict(list)
    evaluated: defaultdict[int, list[PassRecord]] = defaultdict(list)
    for p in record["passes"]:
        (trained if p["trained"] else evaluated)[p["loader"]].append(p)
    window, steps = record.get("window_steps"), record["steps"]
    out = []
    for loader, passes in trained.items():
        cut = [p for p in passes if p.get("cut_after") is not None]
        line = f"training: loader {loader}, {len(passes)} pass{'es' if len(passes) != 1 else ''}"
        if passes[0].get("batches"):
            line += f" of {passes[0]['batches']} batches"
        if cut:
            left = sum((p["batches"] or 0) - (p["cut_after"] or 0) for p in cut if p.get("batches"))
            line += (
                f"; after the compared steps each was cut to {record['keep_batches']} batches "
                f"({_batches(left)} not run)"
            )
        out.append(line)
    if window is not None:
        out.append(
            f"optimizer steps: {steps} ({min(window, steps)} compared with one process"
            + (f", {steps - window} after them, untraced)" if steps > window else ")")
        )
    for loader, passes in evaluated.items():
        whole = sum(p["complete"] for p in passes)
        out.append(
            f"evaluation: loader {loader}, {whole} whole pass{'es' if whole != 1 else ''} of "
            f"{passes[0]['dataset_size']} samples"
            + (f" ({len(passes) - whole} partial)" if whole < len(passes) else "")
        )
    if not evaluated:
        out.append(
            "evaluation: no DataLoader pass without training (none, or not from a DataLoader)"
        )
    saves = record["saves"]
    out.append(
        f"saves: {len(saves)} torch.save call{'s' if len(saves) != 1 else ''}"
        + (f" ({', '.join(sorted({s['site'] for s in saves}))})" if saves else "")
    )
    if record.get("ended_by") == "script":
        how = "the script ran to its end" + (
            ", closing its process group itself"
            if record.get("destroyed_group")
            else "; rankwise closed the process group it left open"
        )
    elif record.get("ended_by") == "failure":
        how = "the script failed on this rank (its error is above)"
    else:
        how = "the watcher ended the script after its last compared step (nothing after it ran)"
    out.append(f"shutdown: {how}")
    return out


def _batches(count: int) -> str:
    return f"{count} batch{'es' if count != 1 else ''}"


def checks(records: list[RankRecord], processes: int) -> list[tuple[str, str | None]]:
    """Each check of the findings as ``(check, why it could not run)``; ``None``: it ran (over what
    it says)."""
    record = records[0]
    training = [p for p in record["passes"] if p["trained"]]
    evaluated = evaluations(record)
    shuffled: defaultdict[int, int] = defaultdict(int)
    epochs_why: str | None
    for p in training:
        if p["distributed_sampler"] and p["shuffle"]:
            shuffled[p["loader"]] += 1
    out: list[tuple[str, str | None]] = [
        ("every process joined one process group", None),
        (
            f"training data sharded over the ranks (training passes: {len(training)})",
            None
            if training and len(records) > 1
            else "no training batch came from a DataLoader on every rank",
        ),
    ]
    if not training:
        epochs_why = "no training pass came from a DataLoader"
    elif not any(p["distributed_sampler"] for p in training):
        epochs_why = (
            "the training loader has no DistributedSampler (its sampler: "
            f"{training[0]['sampler']}), so no set_epoch for the script to call"
        )
    elif not shuffled:
        epochs_why = None if len(training) > 1 else "one training pass (one epoch)"
    else:
        epochs_why = (
            None
            if max(shuffled.values()) > 1
            else "the script entered one epoch: set_epoch matters from the second on"
        )
    out.append(
        (
            "a new order each epoch (set_epoch; passes: "
            f"{max(shuffled.values(), default=len(training))})",
            epochs_why,
        )
    )
    out.append(
        (
            f"evaluation counted exactly once (whole evaluation passes: {len(evaluated)})",
            None if evaluated else "no evaluation DataLoader ran a whole pass",
        )
    )
    out.append(
        (
            f"replicas hold the same weights (optimizer steps: {record['steps']})",
            None if record["steps"] and processes > 1 else "no optimizer step",
        )
    )
    saves = sum(len(r["saves"]) for r in records)
    out.append(
        (
            f"checkpoints written once, loadable without DDP (torch.save calls: {saves})",
            None if saves else "the script saved nothing with torch.save",
        )
    )
    return out
