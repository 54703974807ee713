"""A small GPT-2-style causal language model on synthetic token sequences, on rankwise's public API.

Nothing in the script names a strategy: the launcher chooses one, and the same code runs on
every strategy.  The output layer is tied to the input embedding (as in GPT-2), and saving
keeps one copy of it.

    python examples/causal_lm.py                                        # one process rankwise
    launch --nproc-per-node 2 examples/causal_lm.py            # ddp rankwise launch
    --nproc-per-node 2 --strategy fsdp examples/causal_lm.py rankwise launch --nproc-per-node 2
    --strategy deepspeed-zero2 --precision bf16-mixed examples/causal_lm.py

The sequences follow a fixed random bigram table, so the loss has something to learn.
Rank 0 saves the unwrapped weights and a summary (world size, steps, final loss).
"""

import argparse
import json
from pathlib import Path

import torch
from torch.utils.data import TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

import rankwise


def bigram_sequences(samples: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Token sequences drawn from a fixed random bigram table (each token mostly picks one of a few
    next ones)."""
    generator = torch.Generator().manual_seed(seed)
    table = torch.softmax(3 * torch.randn(vocab, vocab, generator=generator), dim=1)
    tokens = torch.empty(samples, length, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (samples,), generator=generator)
    for position in range(1, length):
        tokens[:, position] = torch.multinomial(
            table[tokens[:, position - 1]], 1, generator=generator
        ).squeeze(1)
    return tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--length", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch")
    parser.add_argument(
        "--grad-accum", type=int, default=2, help="micro-batches per optimizer step"
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--lr", type=float, default=3e-3, help="peak learning rate, after a linear warm-up"
    )
    parser.add_argument(
        "--warmup", type=int, default=4, help="warm-up steps before the cosine decay"
    )
    parser.add_argument(
        "--out", default="runs/causal-lm", help="where rank 0 saves weights and a summary"
    )
    args = parser.parse_args(argv)

    dataset = TensorDataset(bigram_sequences(args.samples, args.length, args.vocab))
    # transformers' own defaults otherwise: dropout 0.1 on embeddings, attention and residuals.
    config = GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.length,
        n_embd=64,
        n_layer=2,
        n_head=4,
        tie_word_embeddings=True,
    )
    with rankwise.setup(seed=0) as rt:  # the strategy comes from the launcher
        model = GPT2LMHeadModel(config)
        # torch's defaults
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        scheduler = get_cosine_schedule_with_warmup(optimizer, args.warmup, args.steps)
        micro = args.batch_size // (args.grad_accum * rt.world_size)
        model, optimizer = rt.prepare(
            model, optimizer, grad_accum=args.grad_accum, micro_batch_size=micro
        )
        loader = rt.loader(dataset, batch_size=args.batch_size // args.grad_accum, shuffle=True)
        step, epoch = 0, 0
        while step < args.steps:
            rt.set_epoch(loader, epoch)
            for _, last, (tokens,) in rankwise.iterate_steps(loader, args.grad_accum):
                tokens = rt.to_device(tokens)
                with rt.no_sync(model, enabled=not last):
                    with rt.autocast():
                        loss = model(input_ids=tokens, labels=tokens).loss
                    rt.backward(loss / args.grad_accum, model)
                if not last:
                    continue
                rt.step(optimizer, model, max_norm=1.0)
                scheduler.step()
                rt.zero_grad(optimizer)
                step += 1
                if step % 10 == 0 or step == args.steps:
                    # Why: one all-reduce per report, only to print the loss averaged over ranks.
                    mean_loss = rt.all_reduce(loss.detach().float(), "mean").item()
                    rt.print(f"step {step}: loss {mean_loss:.4f}")
                if step == args.steps:
                    break
            epoch += 1
        out = Path(args.out)
        rt.save_weights(model, out / "model.safetensors")
        if rt.is_main:
            summary = {
                "world_size": rt.world_size,
                "strategy": rt.strategy_name,
                "steps": step,
                "loss": mean_loss,
            }
            (out / "summary.json").write_text(json.dumps(summary), encoding="utf-8")


if __name__ == "__main__":
    main()
