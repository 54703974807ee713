"""Diagnose the GPU cost of batches whose sequence length changes every step.

    python scripts/gpu_shapes.py [--model base] [--batch-size 128] [--steps 40]

`rankwise train` pads each batch to its own longest text (length-grouped batches), so on the GPU
nearly every step has a new shape.  This times a plain bf16 training step (forward, backward,
fused AdamW), synchronised after every step, on:

  A  the rankwise loader's own batches 0..N-1 (shapes new to the process)
  B  the same batches again (shapes seen before)
  C  batches N..2N-1 with the cuDNN attention backend of scaled_dot_product_attention off
  D  batches 2N..3N-1 padded to a multiple of 16 tokens (few distinct shapes)
  E  batches 3N..4N-1 as they come (new shapes again, the backends as at start)

and profiles one step on a shape never seen before.  Prints medians per variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

# Measured on an H100 (torch 2.11, CUDA 13), base, batch 128: A median 184 ms (a new length:
# 0.17-2.3 s), B 43 ms, C 39 ms, D 42 ms (its 8 widths' first steps up to 2.0 s); hence
# rankwise.train.loop.attention_for_varying_lengths.


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="base")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--cache", default="/tmp/rankwise-speed-cache")
    p.add_argument("--device", default="cuda", help="cpu only to try the script itself")
    args = p.parse_args(argv)

    from rankwise.data.prepare import prepare_data
    from rankwise.models import build_model
    from rankwise.runtime import setup
    from rankwise.train.config import build_config
    from rankwise.train.optim import make_optimizer

    cfg = build_config(
        overrides=[
            f"model.name={args.model}",
            f"batch_size={args.batch_size}",
            f"data.max_length={args.seq}",
            f"data.cache_dir={json.dumps(args.cache)}",
        ]
    )
    data = prepare_data(cfg.data)
    dataset = data.dataset("train", ngrams=data.ngrams is not None)
    n = args.steps
    with setup("single", "bf16-mixed", seed=0) as rt:
        loader = rt.loader(
            dataset,
            args.batch_size,
            shuffle=True,
            seed=0,
            collate_fn=dataset.collate,
            lengths=dataset.lengths,
            group_size=args.batch_size,
        )
        started = time.perf_counter()
        batches = []
        for batch in loader:
            batches.append(batch)
            if len(batches) == 4 * n + 1:
                break
        loader_s = (time.perf_counter() - started) / len(batches)
    n = min(n, (len(batches) - 1) // 4)  # one epoch may hold fewer than 4N + 1 batches
    print(
        f"loader (pinned, as rankwise train): {loader_s * 1e3:.1f} ms per batch; widths of the "
        f"first 12: {[b['input_ids'].shape[1] for b in batches[:12]]}"
    )
    print(
        "sdp backends: flash",
        torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient",
        torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn",
        torch.backends.cuda.cudnn_sdp_enabled(),
        "math",
        torch.backends.cuda.math_sdp_enabled(),
        "| cudnn",
        torch.backends.cudnn.version(),
    )

    torch.manual_seed(0)
    model, _ = build_model(
        args.model,
        num_labels=data.num_labels,
        dropout=0.1,
        vocab_size=data.encoder.vocab_size,
        pad_id=data.encoder.pad_id,
        max_length=args.seq,
        ngrams=data.ngrams.to_dict() if data.ngrams else None,
    )
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.to(device)
    optimizer = make_optimizer(model, cfg, device)

    def step(batch: dict) -> None:
        inputs = {
            k: v.to(device, non_blocking=True)
            for k, v in batch.items()
            if k not in ("labels", "index")
        }
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(**inputs)
        logits = getattr(logits, "logits", logits)
        nn.functional.cross_entropy(logits.float(), batch["labels"].to(device)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def pad16(batch: dict) -> dict:
        width = batch["input_ids"].shape[1]
        extra = -width % 16
        out = dict(batch)
        out["input_ids"] = nn.functional.pad(batch["input_ids"], (0, extra), value=dataset.pad_id)
        out["attention_mask"] = nn.functional.pad(batch["attention_mask"], (0, extra), value=0)
        return out

    def timed(name: str, chosen: list[dict]) -> None:
        times = []
        for batch in chosen:
            sync()
            t = time.perf_counter()
            step(batch)
            sync()
            times.append(time.perf_counter() - t)
        widths = len({b["input_ids"].shape[1] for b in chosen})
        print(
            f"{name}: median {statistics.median(times) * 1e3:.1f} ms, mean "
            f"{statistics.mean(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms over "
            f"{len(times)} steps, {widths} distinct widths; first 8: "
            f"{[round(x * 1e3) for x in times[:8]]}",
            flush=True,
        )

    for warm in batches[:2]:
        step(pad16(warm))  # CUDA context, cuBLAS handles, the allocator: outside every variant
    timed("A new shapes", batches[:n])
    timed("B seen shapes", batches[:n])
    torch.backends.cuda.enable_cudnn_sdp(False)
    timed("C new shapes, cuDNN SDPA off", batches[n : 2 * n])
    torch.backends.cuda.enable_cudnn_sdp(True)
    timed("D padded to a multiple of 16", [pad16(b) for b in batches[2 * n : 3 * n]])
    timed("E new shapes again", batches[3 * n : 4 * n])

    from torch.profiler import ProfilerActivity, profile

    fresh = dict(batches[4 * n])
    width = max(b["input_ids"].shape[1] for b in batches) + 1
    extra = width - fresh["input_ids"].shape[1]
    if width <= args.seq:
        fresh["input_ids"] = nn.functional.pad(fresh["input_ids"], (0, extra), value=dataset.pad_id)
        fresh["attention_mask"] = nn.functional.pad(fresh["attention_mask"], (0, extra), value=0)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(fresh)
        sync()
    print(f"one step on an unseen width {fresh['input_ids'].shape[1]}:")
    print(
        prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
