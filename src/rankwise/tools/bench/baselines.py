"""Training loops written without rankwise, for the benchmarks to measure rankwise against.

All three train the same model on the same prepared data with the same length-grouped,
seeded batches, optimizer, clipping and schedule as ``rankwise train``, so a difference in
speed is the loop's and a difference in weights is a bug:

* ``plain-ddp`` — the DDP loop a careful user writes by hand: nothing per step but the step.
* ``plain-accelerate`` — Hugging Face Accelerate as its documentation shows it
  (``Accelerator(split_batches=True)``, ``prepare``, ``accelerator.backward``).
* ``per-step-sync`` — a common hand-written style: a barrier and an all-reduced loss read
  with ``.item()`` after every step.

Each is a spawn worker: ``worker(local_rank, style, data_dir, out_dir, config_json)``.  Rank 0
writes ``result.json`` (the same throughput keys as ``rankwise train``'s summary, test
accuracy and macro-F1 from an evaluation on rank 0) and the weights after
``cfg.save_at_steps`` steps as ``weights-step-K.safetensors``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

STYLES = ("plain-ddp", "plain-accelerate", "per-step-sync")


def weights_file(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / f"weights-step-{step}.safetensors"


def worker(local_rank: int, style: str, data_dir: str, out_dir: str, config_json: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from rankwise.data.prepare import PreparedData
    from rankwise.measure.memory import peak_rss_megabytes
    from rankwise.measure.throughput import SteadyThroughput, count_tokens
    from rankwise.models import build_model, reads_ngrams
    from rankwise.process import backend_for, destroy_process_group, device_for
    from rankwise.sampling.batching import LengthGroupedSampler
    from rankwise.train.config import TrainConfig
    from rankwise.train.optim import lr_lambda, make_optimizer

    cfg = TrainConfig.model_validate_json(config_json)
    device = device_for(local_rank)
    accelerator = None
    if style == "plain-accelerate":
        from accelerate import Accelerator, DataLoaderConfiguration

        # split_batches: each global batch of the loader is cut across the ranks, as rankwise does.
        accelerator = Accelerator(
            dataloader_config=DataLoaderConfiguration(split_batches=True), cpu=device.type == "cpu"
        )
        device = accelerator.device
    else:
        dist.init_process_group(backend_for(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    data = PreparedData.load(data_dir)
    torch.manual_seed(cfg.seed)
    ngrams = data.ngrams.to_dict() if data.ngrams else None
    assert data.encoder is not None  # the bench's data is text, tokenized
    model, spec = build_model(
        cfg.model.name,
        num_labels=data.num_labels,
        dropout=cfg.model.dropout,
        vocab_size=data.encoder.vocab_size,
        pad_id=data.encoder.pad_id,
        max_length=cfg.data.max_length,
        ngrams=ngrams,
    )
    model.to(device)
    optimizer = make_optimizer(model, cfg, device)  # AdamW, fused where the device has the kernel
    torch.manual_seed(cfg.seed + rank)  # each rank its own dropout stream, as in rankwise
    steps = cfg.max_steps
    assert steps is not None  # the bench sets max_steps for every row
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.optim.schedule, int(cfg.optim.warmup_ratio * steps), steps)
    )
    dataset = data.dataset("train", ngrams=reads_ngrams(spec))
    if accelerator is not None:
        sampler = LengthGroupedSampler(
            dataset, dataset.lengths, cfg.batch_size, num_replicas=1, rank=0, seed=cfg.seed
        )
        loader = DataLoader(
            dataset,
            batch_size=cfg.batch_size,
            sampler=sampler,
            drop_last=True,
            collate_fn=dataset.collate,
        )
        model, optimizer, loader, scheduler = accelerator.prepare(
            model, optimizer, loader, scheduler
        )
    else:
        sampler = LengthGroupedSampler(
            dataset, dataset.lengths, cfg.batch_size, num_replicas=world, rank=rank, seed=cfg.seed
        )
        loader = DataLoader(
            dataset,
            batch_size=cfg.batch_size // world,
            sampler=sampler,
            drop_last=True,
            collate_fn=dataset.collate,
        )
        model = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg.ddp.bucket_cap_mb,
            gradient_as_bucket_view=True,
        )
    # the steps rankwise rows time: after the warm-up, before the last steps they profile
    profiled = cfg.profile_steps if steps > cfg.throughput_warmup_steps + cfg.profile_steps else 0
    timer = SteadyThroughput(cfg.throughput_warmup_steps, timed=steps - profiled)
    done, epoch, train_peak = 0, 0, 0.0
    started = time.perf_counter()
    while done < steps:
        sampler.set_epoch(epoch)
        timer.restart()
        for batch in loader:
            tokens = count_tokens(batch)
            labels = batch.pop("labels").to(device)
            batch.pop("index")
            output = model(**{k: v.to(device) for k, v in batch.items()})
            logits = getattr(output, "logits", output)
            loss = nn.functional.cross_entropy(
                logits.float(), labels, label_smoothing=cfg.optim.label_smoothing
            )
            if accelerator is not None:
                accelerator.backward(loss)
                # (None: no clipping, as in rankwise's loop)
                if cfg.optim.max_grad_norm is not None:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
            else:
                loss.backward()
                if cfg.optim.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if style == "per-step-sync":
                # Why (the style measured): every rank waits for the slowest, then the loss is
                # averaged and read on the host, a device sync, after every step.
                dist.barrier()
                mean_loss = loss.detach().clone()
                dist.all_reduce(mean_loss)
                _ = mean_loss.item() / world
            done += 1
            timer.step(cfg.batch_size, tokens)
            if done in cfg.save_at_steps:
                _save_weights(model, out_dir, done, rank)
                timer.restart()
            if done == steps:
                break
        train_peak = max(train_peak, peak_rss_megabytes())
        epoch += 1
    train_s = time.perf_counter() - started
    all_tokens = torch.tensor(timer.tokens, device=device)
    dist.all_reduce(all_tokens)  # Why: each rank counted only its own part of every batch.
    peaks = [None] * world
    dist.all_gather_object(peaks, (round(train_peak, 1), round(peak_rss_megabytes(), 1)))
    if rank == 0:
        evaluation = _evaluate(_unwrap(model), data, cfg, device, reads_ngrams(spec))
        result = {
            "strategy": style,
            "world_size": world,
            "steps": done,
            "train_s": round(train_s, 3),
            "samples_per_s": round(done * cfg.batch_size / train_s, 2),
            **timer.rates(int(all_tokens)),
            "peak_rss_mb": peaks,
            **evaluation,
        }
        Path(out_dir, "result.json").write_text(json.dumps(result), encoding="utf-8")
    # The DDP module must be gone before the group is (torch 2.13 on gloo aborts at exit otherwise):
    # the last step's output and loss reach it through their autograd graph, so they go too.
    del model, optimizer, scheduler, output, logits, loss
    if accelerator is None:
        # Why a barrier inside: rank 0 evaluates alone; the others must not tear the group down
        # under it.
        destroy_process_group(clean=True)
    else:
        dist.barrier()  # Why: as above, rank 0 evaluates alone.
        accelerator.end_training()  # Accelerate's own teardown of the group it joined


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


def _save_weights(model: nn.Module, out_dir: str, step: int, rank: int) -> None:
    from safetensors.torch import save_file

    if rank == 0:
        state = {k: v.detach().cpu().contiguous() for k, v in _unwrap(model).state_dict().items()}
        save_file(state, str(weights_file(out_dir, step)))


@torch.no_grad()
def _evaluate(model: nn.Module, data: Any, cfg: Any, device: torch.device, ngrams: bool) -> dict:
    """Test accuracy and macro-F1 of ``model`` on this process alone (rank 0)."""
    from sklearn.metrics import accuracy_score, f1_score

    dataset = data.dataset(cfg.eval_split, ngrams=ngrams)
    loader = DataLoader(dataset, batch_size=cfg.eval_batch_size, collate_fn=dataset.collate)
    model.eval()
    predictions, targets = [], []
    for batch in loader:
        targets.append(batch.pop("labels"))
        batch.pop("index")
        output = model(**{k: v.to(device) for k, v in batch.items()})
        predictions.append(getattr(output, "logits", output).argmax(-1).cpu())
    predicted, true = torch.cat(predictions).numpy(), torch.cat(targets).numpy()
    return {
        "eval_split": cfg.eval_split,
        "eval_samples": len(true),
        "accuracy": float(accuracy_score(true, predicted)),
        "macro_f1": float(f1_score(true, predicted, average="macro")),
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m rankwise.tools.bench.baselines STYLE DATA_DIR OUT_DIR NPROC CONFIG_JSON`` (what
    the bench runs)."""
    import sys

    from rankwise.launch.spawn import spawn

    style, data_dir, out_dir, nproc, config_json = argv or sys.argv[1:]
    if style not in STYLES:
        raise SystemExit(f"unknown baseline {style!r}; choose from {', '.join(STYLES)}")
    spawn(worker, int(nproc), (style, data_dir, out_dir, config_json))


if __name__ == "__main__":
    main()
