"""Where a resumed run picks up its data: recorded in every checkpoint, checked before launch and at
the first resumed step.

The global batch is the same at every world size, so "where we are in the data" is one position in
one epoch's global sample order (``batching.global_order``), valid at any world size.  Each
checkpoint records, in its manifest and its training state: the epoch and position, a digest of the
epoch's order, a digest of the samples consumed before the position, a digest of the training data,
the learning rate and the last logged loss.

* Before launch (:func:`check_before_launch`) the launching process recomputes the order from the
  prepared data and refuses a checkpoint whose data or order is not this run's: a changed data file,
  another global batch, seed or length grouping, or an edited manifest.
* At the first resumed step (:func:`first_step_record`) the ranks gather the samples that step
  really trained and compare them with the order's next global batch; the record (printed, and
  ``continuity.json`` in the run directory) says whether a sample was skipped or repeated, and sets
  the learning rate and loss at the cut against the resumed ones.  A failed sample check stops the
  run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from torch.utils.data import DistributedSampler

from rankwise.checkpoint import write_text_atomic
from rankwise.errors import ConfigError
from rankwise.sampling.batching import (
    dataset_size,
    epoch_order,
    global_order,
    order_digest,
    rank_sampler,
)

FILE = "continuity.json"
"""The record of the last resume, in the run directory."""


@dataclass
class PendingCheck:
    """A resume's check, due when its first step has trained: the checkpoint's continuity facts,
    this run's learning rate at the checkpoint's step, and the dataset indices of the micro-batches
    the step trains."""

    facts: dict
    lr: float
    trained: list[int] = field(default_factory=list)

    def saw(self, batch: dict) -> None:
        """A micro-batch of the first resumed step is about to train."""
        self.trained.extend(batch["index"].tolist())


def position(sampler: DistributedSampler, steps_per_epoch: int, batch_size: int, step: int) -> dict:
    """Where ``step`` optimizer steps leave the data: its epoch, the position in that epoch's global
    order, and digests of the order and of the samples before the position (``sampler``: the
    training loader's)."""
    epoch = step // steps_per_epoch
    # the trailing incomplete batch is dropped
    used = epoch_order(sampler, epoch, steps_per_epoch * batch_size)
    offset = (step - epoch * steps_per_epoch) * batch_size
    return {
        "epoch": epoch,
        "position": offset,
        "epoch_samples": len(used),
        "order": order_digest(used),
        "consumed": order_digest(sorted(used[:offset])),
    }


def training_sampler(samples: int, batch_size: int, seed: int, lengths=None) -> DistributedSampler:
    """The training loader's sampler as one process builds it (the order is the same at every world
    size)."""
    # ignore[arg-type]: a range is a map-style dataset of its own indices (sized, indexable), all a
    # sampler reads
    return rank_sampler(
        range(samples),  # type: ignore[arg-type]
        batch_size,
        1,
        0,
        shuffle=True,
        drop_last=True,
        seed=seed,
        lengths=lengths,
        group_size=batch_size,
    )


def check_before_launch(
    checkpoint: str | Path,
    recorded: dict,
    data_digest: str,
    sampler: DistributedSampler,
    batch_size: int,
    data_source: str,
) -> None:
    """Refuse to continue ``checkpoint`` on other data or another sample order (``recorded``: its
    manifest's continuity facts; ``sampler``: this run's, from :func:`training_sampler`)."""
    missing = sorted({"data", "step", "epoch", "position", "order", "consumed"} - recorded.keys())
    if missing:
        raise ConfigError(
            f"--resume {checkpoint}: its manifest's continuity facts lack {', '.join(missing)} "
            "(edited?); restore the manifest or start a new run from its weights"
        )
    if recorded["data"] != data_digest:
        raise ConfigError(
            f"--resume {checkpoint}: the training data changed since this checkpoint (its digest "
            f"{recorded['data']}, {data_source} now gives {data_digest}): continuing would train "
            "on other samples in another order; restore the data the run started with, or start a "
            "new run from the checkpoint's weights (--set model.init_weights=...)"
        )
    steps_per_epoch = dataset_size(sampler.dataset) // batch_size
    now = position(sampler, steps_per_epoch, batch_size, recorded["step"])
    if (now["epoch"], now["position"], now["order"], now["consumed"]) != (
        recorded["epoch"],
        recorded["position"],
        recorded["order"],
        recorded["consumed"],
    ):
        raise ConfigError(
            f"--resume {checkpoint}: its sample order is not this run's (recorded: epoch "
            f"{recorded['epoch']}, position {recorded['position']}, order {recorded['order']}, "
            f"consumed {recorded['consumed']}; this run: epoch {now['epoch']}, position "
            f"{now['position']}, order {now['order']}, consumed {now['consumed']}): the global "
            "batch, seed or data.group_by_length differ, or the manifest was edited; resume with "
            "the checkpoint's own settings (its config.json)"
        )


def first_step_record(
    rt,
    loader,
    recorded: dict,
    trained: list[int],
    *,
    step: int,
    steps_per_epoch: int,
    batch_size: int,
    lr_resumed: float,
    loss: float,
    data_digest: str,
    resumed_from: str,
) -> dict:
    """The continuity record of a resume, made once the first resumed step (``step + 1``) has
    trained (a collective: every rank calls it).  ``loader``: the training loader; ``trained``: the
    dataset indices this rank's micro-batches of that step really held (each batch's ``index``)."""
    now = position(loader.sampler, steps_per_epoch, batch_size, step)
    order = global_order(loader.sampler)  # the epoch the loader really iterates
    expected = order[now["position"] : now["position"] + batch_size]
    # Why: the ranks' shares together are the step's global batch.
    everyone = [index for share in rt.all_gather_object(list(trained)) for index in share]
    checks = {
        "data": recorded["data"] == data_digest,
        "order": recorded["order"] == now["order"] and loader.sampler.epoch == now["epoch"],
        "consumed": (recorded["position"], recorded["consumed"])
        == (now["position"], now["consumed"]),
        "first_step": sorted(everyone) == sorted(expected) and len(set(everyone)) == len(everyone),
    }
    return {
        "resumed_from": resumed_from,
        "step": step,
        "epoch": now["epoch"],
        "written": {"strategy": recorded.get("strategy"), "world_size": recorded.get("world_size")},
        "resumed": {"strategy": rt.strategy_name, "world_size": rt.world_size},
        "position": now["position"],
        "epoch_samples": now["epoch_samples"],
        "order": now["order"],
        "checks": checks,
        "continuous": all(checks.values()),
        "first_step_samples": len(everyone),
        "first_step_distinct": len(set(everyone)),
        "lr": {"at_checkpoint": recorded.get("lr"), "resumed": lr_resumed},
        "loss": {
            "last_logged": recorded.get("loss"),
            "first_resumed_step": {"step": step + 1, "value": loss},
        },
    }


def describe(record: dict) -> str:
    """The record as the lines a resumed run prints."""
    written, resumed = record["written"], record["resumed"]
    checks = record["checks"]
    first, total = record["position"], record["epoch_samples"]
    lines = [
        f"continuity: resumed {record['resumed_from']} at step {record['step']} "
        f"({written['strategy']} x{written['world_size']} -> {resumed['strategy']} "
        f"x{resumed['world_size']}), epoch {record['epoch']}, sample {first} of {total} in its "
        "order"
    ]
    lines.append(
        f"  data and order: {'the same' if checks['data'] and checks['order'] else 'DIFFERENT'} "
        f"(order {record['order']})"
    )
    lines.append(
        f"  before the cut: the order's first {first} samples "
        f"{'(digest matches)' if checks['consumed'] else 'DO NOT MATCH the checkpoint'}"
    )
    batch = (
        f"global batch {record['step'] + 1} of the order"
        if checks["first_step"]
        else "NOT the order's next batch"
    )
    lines.append(
        f"  step {record['step'] + 1}: the ranks trained {record['first_step_samples']} samples "
        f"({record['first_step_distinct']} distinct) = {batch}"
    )
    verdict = "no sample skipped, none repeated" if record["continuous"] else "NOT CONTINUOUS"
    lines.append(f"  {verdict}")
    lr = record["lr"]
    if lr["at_checkpoint"] is not None:
        same = abs(lr["at_checkpoint"] - lr["resumed"]) <= 1e-12 * max(
            abs(lr["at_checkpoint"]), 1e-30
        )
        changed = "" if same else " (the schedule changed: other max_steps, epochs or warm-up?)"
        lines.append(
            f"  learning rate: {lr['at_checkpoint']:.6g} at the cut, {lr['resumed']:.6g} from this "
            f"run's schedule{changed}"
        )
    logged = record["loss"]["last_logged"]
    resumed_loss = record["loss"]["first_resumed_step"]
    lines.append(
        f"  loss: {resumed_loss['value']:.4f} at step {resumed_loss['step']}"
        + (f", last logged {logged['value']:.4f} at step {logged['step']}" if logged else "")
    )
    return "\n".join(lines)


def write(run_dir: Path, record: dict) -> None:
    write_text_atomic(Path(run_dir) / FILE, json.dumps(record, indent=2))
