"""Speed of rankwise's training loop on one CUDA GPU, against the chip and against a plain loop.

    python scripts/gpu_speed.py [--model base] [--batch-size 128] [--seq 128] [--pairs 3]
    [--json-out FILE]

Measures, in one process:

* a bf16 matrix product (8192 x 8192 x 8192, random data): the ceiling measured on this card;
* rankwise's loop (``single``, the ``Trainer``'s own ``train`` with its per-step bookkeeping) and a
  plain hand-written PyTorch loop (autocast, backward, clipping, fused AdamW, scheduler), the
  same model from the same seed on the same batches, in alternating pairs (``--pairs``; the order
  flips every pair), each warmed up first and timed between two device synchronisations;
* FLOPs of one training step (forward and backward) counted by ``torch.utils.flop_counter``:
  TFLOP/s and MFU against the datasheet peak (``--peak-tflops``, default the H100 SXM's dense
  bf16 989.4) and against the measured matrix product;
* optionally (``--cli``) an end-to-end ``rankwise train`` of the same model (its own batches,
  padded to each batch's longest text) and its summary's steady samples/s.

Batches are real training texts of the built-in sentiment data, every one padded to exactly
``--seq`` tokens, so that every step does the same counted work.  Prints a table and writes
every number as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

H100_SXM_BF16_DENSE_TFLOPS = 989.4


def matmul_tflops(n: int = 8192, repeats: int = 20) -> float:
    """Median TFLOP/s of an ``n``-cubed bf16 matrix product on random data (3 warm-ups)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    return 2 * n**3 / statistics.median(times) / 1e12


def fixed_batches(
    data, ngrams: bool, batch_size: int, seq: int, count: int, seed: int
) -> list[dict]:
    """``count`` batches of real training texts (a seeded draw), each padded to exactly ``seq``
    tokens."""
    dataset = data.dataset("train", ngrams=ngrams)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    batches = []
    for b in range(count):
        rows = [order[(b * batch_size + i) % len(order)] for i in range(batch_size)]
        batch = dataset.collate([dataset[i] for i in rows])
        width = batch["input_ids"].shape[1]
        if width > seq:
            raise ValueError(f"a text has {width} tokens, more than --seq {seq}")
        pad = seq - width
        batch["input_ids"] = nn.functional.pad(batch["input_ids"], (0, pad), value=dataset.pad_id)
        batch["attention_mask"] = nn.functional.pad(batch["attention_mask"], (0, pad), value=0)
        batches.append(batch)
    return batches


class Batches:
    """A fixed list of batches standing in for the Trainer's loader (same length, iterable
    again)."""

    sampler = None  # nothing to reshuffle per epoch

    def __init__(self, batches: list[dict]):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def run_rankwise(cfg, data, batches: list[dict], warmup: int, steps: int) -> float:
    """Seconds for ``steps`` steps of rankwise's own loop (``Trainer.train``), after ``warmup``
    untimed ones."""
    from tqdm import tqdm

    from rankwise.measure.throughput import SteadyThroughput
    from rankwise.runtime import setup
    from rankwise.train.loop import Trainer
    from rankwise.train.metrics import MetricsLog
    from rankwise.train.preemption import StopRequest

    with (
        tempfile.TemporaryDirectory() as run_dir,
        setup("single", cfg.precision, seed=cfg.seed) as rt,
    ):
        trainer = Trainer(cfg, data, Path(run_dir), rt)
        trainer.loader = Batches(batches)
        trainer.steps_per_epoch = len(batches)
        trainer.metrics = MetricsLog(trainer.run_dir, enabled=False)
        trainer.throughput = SteadyThroughput(0)
        trainer.save = lambda epoch: None  # the epoch-end checkpoint is not training
        bar, stop = tqdm(disable=True), StopRequest()
        try:
            trainer.schedule = replace(
                trainer.schedule,
                total_steps=warmup,
                steps_per_epoch=len(batches),
                evaluate_dev=False,
            )
            trainer.train(bar, stop)
            torch.cuda.synchronize()
            started = time.perf_counter()
            trainer.schedule = replace(trainer.schedule, total_steps=warmup + steps)
            trainer.train(bar, stop)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - started
        finally:
            stop.close()
        assert trainer.step == warmup + steps
        del trainer
    torch.cuda.empty_cache()
    return seconds


def plain_model(cfg, data):
    from rankwise.models import build_model

    torch.manual_seed(cfg.seed)
    return build_model(
        cfg.model.name,
        num_labels=data.num_labels,
        dropout=cfg.model.dropout,
        vocab_size=data.encoder.vocab_size,
        pad_id=data.encoder.pad_id,
        max_length=cfg.data.max_length,
        ngrams=data.ngrams.to_dict() if data.ngrams else None,
    )[0]


def plain_step(model, batch, device, dtype, label_smoothing: float):
    """Forward and backward of one batch, as a user writes it by hand; returns the loss."""
    inputs = {
        k: v.to(device, non_blocking=True) for k, v in batch.items() if k not in ("labels", "index")
    }
    labels = batch["labels"].to(device, non_blocking=True)
    with torch.autocast("cuda", dtype=dtype):
        output = model(**inputs)
    logits = getattr(output, "logits", output)
    loss = nn.functional.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)
    loss.backward()
    return loss


def run_plain(cfg, data, batches: list[dict], warmup: int, steps: int) -> float:
    """Seconds for ``steps`` steps of a plain PyTorch loop on the same model and batches."""
    from rankwise.train.optim import lr_lambda, make_optimizer

    device, dtype = torch.device("cuda"), torch.bfloat16
    model = plain_model(cfg, data).to(device)
    optimizer = make_optimizer(model, cfg, device)  # the same fused AdamW and parameter groups
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lr_lambda(
            cfg.optim.schedule, int(cfg.optim.warmup_ratio * (warmup + steps)), warmup + steps
        ),
    )
    torch.manual_seed(cfg.seed)
    seconds = 0.0
    for phase, count in (("warmup", warmup), ("timed", steps)):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for batch in batches[:count] if phase == "warmup" else batches[warmup : warmup + count]:
            plain_step(model, batch, device, dtype, cfg.optim.label_smoothing)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    del model, optimizer
    torch.cuda.empty_cache()
    return seconds


def step_flops(cfg, data, batch: dict) -> int:
    """FLOPs of one forward and backward pass on ``batch``, as torch's FLOP counter counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    model = plain_model(cfg, data).cuda()
    # warm
    plain_step(model, batch, torch.device("cuda"), torch.bfloat16, cfg.optim.label_smoothing)
    model.zero_grad(set_to_none=True)
    counter = FlopCounterMode(display=False)
    with counter:
        plain_step(model, batch, torch.device("cuda"), torch.bfloat16, cfg.optim.label_smoothing)
    del model
    torch.cuda.empty_cache()
    return counter.get_total_flops()


def cli_run(args, cache: str) -> dict:
    """``rankwise train`` end to end on the same model (its own length-grouped batches); its
    summary."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable,
            "-m",
            "rankwise.cli",
            "train",
            "--data",
            "sentiment",
            "--model",
            args.model,
            "--precision",
            "bf16-mixed",
            "--batch-size",
            str(args.batch_size),
            "--max-steps",
            str(args.cli_steps),
            "--out",
            out,
            "--json",
            "--no-progress",
            "--set",
            f"data.max_length={args.seq}",
            "--set",
            "dev_each_epoch=false",
            "--set",
            "throughput_warmup_steps=10",
            "--set",
            f"data.cache_dir={json.dumps(cache)}",
        ]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if proc.returncode:
            return {"error": proc.stderr[-3000:]}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="base")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=30, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    p.add_argument("--pairs", type=int, default=3, help="alternating rankwise / plain pairs")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=H100_SXM_BF16_DENSE_TFLOPS,
        help="datasheet dense bf16 peak (default: H100 SXM, 989.4)",
    )
    p.add_argument("--cli", action="store_true", help="also time an end-to-end `rankwise train`")
    p.add_argument("--cli-steps", type=int, default=60)
    p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "rankwise-speed-cache"))
    p.add_argument("--json-out", help="write every number here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_speed.py needs a CUDA GPU")

    from rankwise.data.prepare import prepare_data
    from rankwise.train.config import build_config
    from rankwise.train.loop import attention_for_varying_lengths

    cfg = build_config(
        overrides=[
            f"model.name={args.model}",
            "precision=bf16-mixed",
            f"batch_size={args.batch_size}",
            f"data.max_length={args.seq}",
            "progress=false",
            "seed=0",
            "log_every=1000000",
            "dev_each_epoch=false",
            f"data.cache_dir={json.dumps(args.cache)}",
        ]
    )
    data = prepare_data(cfg.data)
    # The same attention backends for both loops: rankwise's Trainer turns cuDNN attention off
    # process-wide.
    attention_for_varying_lengths(torch.device("cuda"))
    # A BERT preset built with the data's n-gram settings also reads each text's n-grams.
    batches = fixed_batches(
        data, data.ngrams is not None, args.batch_size, args.seq, args.warmup + args.steps, cfg.seed
    )
    real_tokens = sum(int(b["attention_mask"].sum()) for b in batches) / (
        len(batches) * args.batch_size
    )

    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "model": args.model,
        "precision": cfg.precision,
        "batch_size": args.batch_size,
        "seq": args.seq,
        "real_tokens_per_sample": round(real_tokens, 1),
        "warmup": args.warmup,
        "steps": args.steps,
        "peak_tflops_datasheet": args.peak_tflops,
    }
    result["matmul_tflops"] = round(matmul_tflops(), 1)
    flops = step_flops(cfg, data, batches[0])
    result["flops_per_step"] = flops
    params = sum(p.numel() for p in plain_model(cfg, data).parameters())
    result["parameters"] = params
    result["flops_6NT_per_step"] = 6 * params * args.batch_size * args.seq
    pairs = []
    for i in range(args.pairs):
        order = ("rankwise", "plain") if i % 2 == 0 else ("plain", "rankwise")
        times = {}
        for which in order:
            run = run_rankwise if which == "rankwise" else run_plain
            times[which] = run(cfg, data, batches, args.warmup, args.steps)
        pairs.append(
            {
                "order": list(order),
                "rankwise_s": round(times["rankwise"], 4),
                "plain_s": round(times["plain"], 4),
                "ratio_rankwise_over_plain": round(times["rankwise"] / times["plain"], 4),
            }
        )
        print(
            f"pair {i + 1}: {order[0]} first: rankwise {times['rankwise']:.3f} s, plain "
            f"{times['plain']:.3f} s for {args.steps} steps (rankwise/plain time "
            f"{times['rankwise'] / times['plain']:.3f})",
            flush=True,
        )
    result["pairs"] = pairs
    for which in ("rankwise", "plain"):
        seconds = statistics.median(pair[f"{which}_s"] for pair in pairs)
        tflops = flops * args.steps / seconds / 1e12
        result[which] = {
            "median_s": round(seconds, 4),
            "samples_per_s": round(args.steps * args.batch_size / seconds, 1),
            "tflops": round(tflops, 1),
            "mfu_datasheet": round(tflops / args.peak_tflops, 4),
            "fraction_of_matmul": round(tflops / result["matmul_tflops"], 4),
        }
    result["ratio_median"] = round(
        statistics.median(p["ratio_rankwise_over_plain"] for p in pairs), 4
    )
    if args.cli:
        summary = cli_run(args, args.cache)
        result["cli"] = {
            k: summary.get(k)
            for k in (
                "error",
                "device",
                "steps",
                "samples_per_s",
                "steady_samples_per_s",
                "tokens_per_s",
                "accuracy",
                "train_s",
            )
        }

    print(
        f"\n{result['device']}, torch {result['torch']}, CUDA {result['cuda']}; {args.model} "
        f"({params / 1e6:.1f}M parameters), bf16-mixed, batch {args.batch_size} x {args.seq} "
        f"tokens ({real_tokens:.1f} real per sample)"
    )
    print(f"bf16 matmul 8192^3: {result['matmul_tflops']} TFLOP/s (datasheet {args.peak_tflops})")
    print(
        f"FLOPs per step (counted): {flops / 1e12:.3f} T (6*N*tokens: "
        f"{result['flops_6NT_per_step'] / 1e12:.3f} T)"
    )
    print("| loop | median s | samples/s | TFLOP/s | MFU (datasheet) | of measured matmul |")
    print("|---|---:|---:|---:|---:|---:|")
    for which in ("rankwise", "plain"):
        r = result[which]
        print(
            f"| {which} | {r['median_s']} | {r['samples_per_s']} | {r['tflops']} | "
            f"{r['mfu_datasheet']:.1%} | {r['fraction_of_matmul']:.1%} |"
        )
    print(
        f"rankwise / plain time: median {result['ratio_median']} over {args.pairs} alternating "
        "pairs"
    )
    if args.cli:
        print(f"rankwise train end to end: {result['cli']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
