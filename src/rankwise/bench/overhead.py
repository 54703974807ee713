"""Overhead of rankwise's DDP loop against a minimal hand-written DDP loop.

Same model (the default tiny wide-and-deep BERT), same prepared data and length-grouped batches, same global
batch, same optimizer, clipping and schedule, same number of steps, 2 processes x
(cores / 2) threads, both started by the spawn launcher.  Runs alternate (rankwise,
hand-written, then hand-written, rankwise, ...) and the report is the median of the per-pair throughput
ratios::

    python -m rankwise.bench.overhead --pairs 5 --steps 200
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from rankwise.bench.common import machine, median
from rankwise.config import build_config
from rankwise.data.prepare import PreparedData, prepare_data
from rankwise.launch.spawn import spawn


def _config(steps: int, batch: int, strategy: str = "ddp"):
    return build_config(overrides=[f"strategy={strategy}", f"max_steps={steps}", f"batch_size={batch}",
                                   "progress=false", "eval_split=test", "log_every=20"])


def rankwise_worker(local_rank: int, data_dir: str, run_dir: str, steps: int, batch: int) -> None:
    from rankwise.loop import run_training

    summary = run_training(_config(steps, batch), PreparedData.load(data_dir), run_dir)
    if local_rank == 0:
        Path(run_dir, "throughput.json").write_text(json.dumps({"samples_per_s": summary["samples_per_s"]}))


def handwritten_worker(local_rank: int, data_dir: str, run_dir: str, steps: int, batch: int) -> None:
    """The loop a careful user writes by hand: no logging, no checkpoints, no evaluation."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from rankwise.data.sampler import LengthGroupedSampler
    from rankwise.loop import lr_lambda, parameter_groups
    from rankwise.models import build_model

    cfg = _config(steps, batch)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = PreparedData.load(data_dir)
    torch.manual_seed(cfg.seed)
    model, _ = build_model(cfg.model.name, num_labels=data.num_labels, dropout=cfg.model.dropout,
                           vocab_size=data.encoder.vocab_size, pad_id=data.encoder.pad_id,
                           max_length=cfg.data.max_length, ngrams=data.ngrams.to_dict() if data.ngrams else None)
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.optim.weight_decay), lr=cfg.optim.lr, fused=True)
    warmup = int(cfg.optim.warmup_ratio * steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.optim.schedule, warmup, steps))
    model = DistributedDataParallel(model, bucket_cap_mb=cfg.ddp.bucket_cap_mb, gradient_as_bucket_view=True)
    dataset = data.dataset("train", ngrams=data.ngrams is not None)  # the same inputs as rankwise's default model
    # The same length-grouped DistributedSampler as rankwise's default (data.group_by_length), so both
    # loops see identical batches and the comparison measures the loop alone.
    sampler = LengthGroupedSampler(dataset, dataset.lengths, batch, num_replicas=world, rank=rank, seed=cfg.seed)
    loader = DataLoader(dataset, batch_size=batch // world, sampler=sampler, drop_last=True,
                        collate_fn=dataset.collate)
    done, epoch = 0, 0
    started = time.perf_counter()
    while done < steps:
        sampler.set_epoch(epoch)
        for batch_ in loader:
            labels = batch_.pop("labels")
            batch_.pop("index")
            output = model(**batch_)  # the wide-and-deep model returns logits, HF models an output object
            logits = getattr(output, "logits", output)
            loss = nn.functional.cross_entropy(logits, labels,
                                               label_smoothing=cfg.optim.label_smoothing)  # same loss as rankwise
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            done += 1
            if done == steps:
                break
        epoch += 1
    elapsed = time.perf_counter() - started
    if rank == 0:
        Path(run_dir, "throughput.json").write_text(json.dumps({"samples_per_s": steps * batch / elapsed}))
    del model
    dist.barrier()
    dist.destroy_process_group()


def measure(worker, data_dir: Path, root: Path, name: str, steps: int, batch: int, nproc: int) -> float:
    run_dir = root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    spawn(worker, nproc, (str(data_dir), str(run_dir), steps, batch))
    return json.loads((run_dir / "throughput.json").read_text())["samples_per_s"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="alternating (rankwise, hand-written) pairs")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="rankwise-overhead-") as tmp:
        root = Path(tmp)
        prepare_data(_config(args.steps, args.batch_size).data).save(root / "data")
        pairs = []
        for i in range(args.pairs):
            order = [("rankwise", rankwise_worker), ("hand", handwritten_worker)]
            if i % 2:
                order.reverse()  # A-B, B-A, ...: neither loop always runs first (warm caches, clock drift)
            speed = {name: measure(worker, root / "data", root, f"{name}-{i}", args.steps, args.batch_size,
                                   args.nproc) for name, worker in order}
            ours, theirs = speed["rankwise"], speed["hand"]
            pairs.append((ours, theirs))
            print(f"pair {i}: rankwise {ours:.1f} samples/s, hand-written {theirs:.1f} samples/s, "
                  f"ratio {ours / theirs:.3f}", flush=True)
    ratio = median([a / b for a, b in pairs])
    result = {"ratio_median": round(ratio, 4), "pairs": pairs, "steps": args.steps, "batch_size": args.batch_size,
              "nproc": args.nproc, **machine()}
    print(f"median throughput ratio rankwise / hand-written: {ratio:.3f} (goal >= 0.98)")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
