"""A Llama-style decoder (transformers' ``LlamaForCausalLM``) pre-trained on random tokens, on
rankwise's public API.

``--size`` picks the shape: ``tiny`` (two 64-wide layers, trains here in seconds), ``1b`` (Llama 3.2
1B's shape) or ``8b`` (Llama 3 8B's: 32 layers of 4096, grouped-query attention with 8 key-value
heads, a 128,256-token vocabulary; about 8.0 billion parameters).  The 8B one does not fit this
machine: plan it instead of running it,

    rankwise plan examples/llama_pretrain.py --nproc-per-node 8,64,512 --device h100 --precision
    bf16-mixed \\
        --micro-batch 1 -- --size 8b --length 4096

which builds the model with fake parameters (no memory) and replays one step on them.

    python examples/llama_pretrain.py                                   # tiny, one process
    rankwise launch --nproc-per-node 2 --strategy fsdp examples/llama_pretrain.py
    # one GPU, as scripts/gpu_llama.py times it:
    rankwise launch --precision bf16-mixed examples/llama_pretrain.py --size 1b --length 2048 \
        --batch-size 4 --compile
"""

import argparse

import torch
from torch.utils.data import TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

import rankwise

SIZES = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=list(SIZES), default="tiny")
    parser.add_argument("--length", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch per micro-step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the model (rt.prepare(compile=True))"
    )
    args = parser.parse_args(argv)

    config = LlamaConfig(max_position_embeddings=max(args.length, 128), **SIZES[args.size])
    vocab = config.vocab_size
    tokens = torch.randint(
        0, vocab, (args.samples, args.length), generator=torch.Generator().manual_seed(0)
    )
    with rankwise.setup(seed=0) as rt:
        model = LlamaForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
        model, optimizer = rt.prepare(model, optimizer, compile=args.compile)
        loader = rt.loader(TensorDataset(tokens), batch_size=args.batch_size, shuffle=True)
        step, epoch = 0, 0
        while step < args.steps:
            rt.set_epoch(loader, epoch)
            for (batch,) in loader:
                batch = rt.to_device(batch)
                with rt.autocast():
                    loss = model(input_ids=batch, labels=batch).loss
                rt.backward(loss, model)
                rt.step(optimizer, model, max_norm=1.0)
                rt.zero_grad(optimizer)
                step += 1
                if step % 10 == 0:
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
