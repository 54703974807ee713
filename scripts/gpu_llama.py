"""Llama pre-training speed on one GPU: rankwise's loop against a plain hand-written one, and MFU.

    python scripts/gpu_llama.py [--size 1b] [--length 2048] [--batch-size 4] [--pairs 3]
        [--no-compile] [--json-out FILE]
    python scripts/gpu_llama.py --device cpu --size tiny --length 32 --batch-size 4 --steps 3

The model is ``examples/llama_pretrain.py``'s (transformers' ``LlamaForCausalLM`` at Llama 3.2
1B's shape, fused SDPA attention), in bf16 mixed precision with ``torch.compile``, on random token
batches fixed in advance.  Two loops train it from the same seed on the same batches, in
alternating pairs (the order flips every pair), each warmed up (the compile) and then timed
between two device synchronisations:

* **rankwise**: ``rankwise.setup("single", "bf16-mixed")``, ``rt.prepare(..., compile=True)``,
  ``rt.autocast``, ``rt.backward``, ``rt.step(max_norm=1.0)``, ``rt.zero_grad`` — what a script on
  rankwise runs;
* **plain**: ``model.to(device)``, ``torch.compile(model)``, ``torch.autocast``, ``backward``,
  ``clip_grad_norm_``, fused AdamW, ``zero_grad(set_to_none=True)``.

FLOPs of a step are counted by ``torch.utils.flop_counter`` on the device (attention included);
MFU is that over the step time and the datasheet's dense bf16 peak (``--peak-tflops``: the H100's
and H200's 989.4) and over a bf16 matrix product measured here.  Goals (issue 53): MFU at least
40 % of the datasheet at 1B, and rankwise / plain at least 0.98.  Prints a table; ``--json-out``
writes every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from llama_pretrain import SIZES  # noqa: E402

DATASHEET_BF16_DENSE_TFLOPS = 989.4
"""The H100 SXM's and H200's dense bf16 peak."""


def build(size: str, length: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        max_position_embeddings=max(length, 128), attn_implementation="sdpa", **SIZES[size]
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    return model, config.vocab_size


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_rankwise(args, batches: list[torch.Tensor], device: torch.device) -> float:
    """Seconds per step of rankwise's loop, after ``args.warmup`` steps."""
    import rankwise

    with rankwise.setup("single", "bf16-mixed", seed=0) as rt:
        model, _ = build(args.size, args.length)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
        model, optimizer = rt.prepare(model, optimizer, compile=not args.no_compile)
        for number, batch in enumerate(batches):
            if number == args.warmup:
                synchronize(rt.device)
                started = time.perf_counter()
            batch = rt.to_device(batch)
            with rt.autocast():
                loss = model(input_ids=batch, labels=batch).loss
            rt.backward(loss, model)
            rt.step(optimizer, model, max_norm=1.0)
            rt.zero_grad(optimizer)
        synchronize(rt.device)
        seconds = time.perf_counter() - started
    return seconds / (len(batches) - args.warmup)


def run_plain(args, batches: list[torch.Tensor], device: torch.device) -> float:
    """Seconds per step of the plain loop, after ``args.warmup`` steps."""
    model, _ = build(args.size, args.length)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    forward = model if args.no_compile else torch.compile(model)
    for number, batch in enumerate(batches):
        if number == args.warmup:
            synchronize(device)
            started = time.perf_counter()
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = forward(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return (time.perf_counter() - started) / (len(batches) - args.warmup)


def step_flops(args, batch: torch.Tensor, device: torch.device) -> int:
    """One step's forward and backward FLOPs, counted on the device (attention included: on a CPU
    through rankwise's formula for its fused kernel)."""
    from torch.utils.flop_counter import FlopCounterMode

    from rankwise.compat.flop_formulas import cpu_attention

    model, _ = build(args.size, args.length)
    model.to(device)
    batch = batch.to(device)
    with FlopCounterMode(display=False, custom_mapping=cpu_attention()) as counter:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
    return int(counter.get_total_flops())


def matmul_tflops(device: torch.device, n: int = 8192, repeats: int = 20) -> float | None:
    """Median TFLOP/s of an ``n``-cubed bf16 matrix product (a GPU only)."""
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - started)
    return 2 * n**3 / statistics.median(times) / 1e12


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=list(SIZES), default="1b")
    parser.add_argument("--length", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (the compile)")
    parser.add_argument("--pairs", type=int, default=3, help="alternating rankwise / plain pairs")
    parser.add_argument("--no-compile", action="store_true", help="both loops eager")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try it")
    parser.add_argument("--peak-tflops", type=float, default=DATASHEET_BF16_DENSE_TFLOPS)
    parser.add_argument("--json-out", help="write every number here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_llama.py: no CUDA device (--device cpu tries it here)")

    vocab = SIZES[args.size]["vocab_size"]
    generator = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(0, vocab, (args.batch_size, args.length), generator=generator)
        for _ in range(args.warmup + args.steps)
    ]
    if device.type == "cuda":
        batches = [batch.pin_memory() for batch in batches]
    result: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "size": args.size,
        "length": args.length,
        "batch_size": args.batch_size,
        "compile": not args.no_compile,
        "peak_tflops_datasheet": args.peak_tflops,
        "matmul_tflops": matmul_tflops(device),
        "flops_per_step": step_flops(args, batches[0], device),
    }
    pairs = []
    for number in range(args.pairs):
        order = ("rankwise", "plain") if number % 2 == 0 else ("plain", "rankwise")
        timed = {}
        for loop in order:
            timed[loop] = (run_rankwise if loop == "rankwise" else run_plain)(args, batches, device)
            print(f"pair {number + 1} {loop}: {timed[loop] * 1e3:.1f} ms a step", flush=True)
        pairs.append(timed)
    for loop in ("rankwise", "plain"):
        step_s = statistics.median(pair[loop] for pair in pairs)
        tflops = result["flops_per_step"] / step_s / 1e12
        result[loop] = {
            "step_s": step_s,
            "tokens_per_s": args.batch_size * args.length / step_s,
            "tflops_per_s": tflops,
            "mfu_datasheet": tflops / args.peak_tflops,
            "mfu_measured": tflops / result["matmul_tflops"] if result["matmul_tflops"] else None,
        }
    result["pairs"] = pairs
    result["rankwise_over_plain"] = [pair["plain"] / pair["rankwise"] for pair in pairs]
    ratio = statistics.median(result["rankwise_over_plain"])
    for loop in ("rankwise", "plain"):
        line = result[loop]
        print(
            f"{loop:9} {line['step_s'] * 1e3:9.1f} ms a step  {line['tokens_per_s']:11.0f} tokens/s"
            f"  {line['tflops_per_s']:8.2f} TFLOP/s  MFU {line['mfu_datasheet']:.1%} of the "
            f"datasheet's {args.peak_tflops}"
        )
    print(f"rankwise / plain (throughput, median of {args.pairs} pairs): {ratio:.3f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
