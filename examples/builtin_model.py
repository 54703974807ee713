"""`rankwise train`'s built-in model and optimizer on synthetic token ids, on rankwise's public API.

The model is the BERT preset `rankwise train --model` builds (`tiny` by default: ~1M parameters,
hidden 128, two layers) with the built-in data's shapes (a 6,000-token vocabulary, 96 tokens a text,
two labels) and the built-in optimizer (fused AdamW, no weight decay on biases and LayerNorm
weights); the loss is the built-in task's cross-entropy with label smoothing.  The token ids are
random: a script to measure and plan with (`rankwise plan examples/builtin_model.py`, `rankwise
bench --script`), not to learn anything from.

    python examples/builtin_model.py                                     # one process
    rankwise launch --nproc-per-node 2 --strategy fsdp examples/builtin_model.py --model small
"""

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import rankwise
from rankwise.models import build_model
from rankwise.train.optim import parameter_groups


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny", help="a BERT preset: tiny, small, base, large")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument(
        "--length", type=int, default=96, help="tokens per text (rankwise train's data.max_length)"
    )
    parser.add_argument("--vocab", type=int, default=6000)
    parser.add_argument(
        "--batch-size", type=int, default=32, help="global batch per optimizer step"
    )
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, args.vocab, (args.samples, args.length), generator=generator)
    labels = torch.randint(0, 2, (args.samples,), generator=generator)
    dataset = TensorDataset(tokens, labels)
    with rankwise.setup(seed=0) as rt:
        model, _ = build_model(
            args.model, num_labels=2, dropout=0.1, vocab_size=args.vocab, max_length=args.length
        )
        optimizer = torch.optim.AdamW(
            parameter_groups(model, 0.01), lr=1e-3, betas=(0.9, 0.98), eps=1e-6, fused=True
        )
        model, optimizer = rt.prepare(model, optimizer)
        loader = rt.loader(dataset, batch_size=args.batch_size, shuffle=True)
        step, epoch = 0, 0
        while step < args.steps:
            rt.set_epoch(loader, epoch)
            for ids, target in loader:
                ids, target = rt.to_device((ids, target))
                with rt.autocast():
                    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
                    loss = F.cross_entropy(logits.float(), target, label_smoothing=0.1)
                rt.backward(loss, model)
                rt.step(optimizer, model, max_norm=1.0)
                rt.zero_grad(optimizer)
                step += 1
                if step % 10 == 0 or step == args.steps:
                    # Why: one all-reduce per report, only to print the loss averaged over ranks.
                    rt.print(
                        f"step {step}: loss "
                        f"{rt.all_reduce(loss.detach().float(), 'mean').item():.4f}"
                    )
                if step == args.steps:
                    break
            epoch += 1


if __name__ == "__main__":
    main()
