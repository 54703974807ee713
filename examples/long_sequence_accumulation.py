"""The BigBird article's long-sequence run, on rankwise: small per-rank batch, long inputs,
gradient accumulation, clipping, a progress bar and TensorBoard on rank 0, periodic saves.

The article keeps settings in a ``Config`` class (gpus per node, node rank ``nr``,
nodes) and computes ``rank = nr * gpus + gpu`` and MASTER_ADDR/PORT by hand; here the
same class feeds ``rankwise.spawn``, which does that arithmetic.  The model is a
transformers BigBird classifier with block-sparse attention, built from a config (no
download); the documents are built-in Chinese reviews of one label joined to ~1,000
characters.  Evaluation is distributed and exact instead of rank-0-only::

    python examples/long_sequence_accumulation.py            # 2 processes on this node
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

import rankwise
from rankwise.data.datasets import TokenizedTextDataset
from rankwise.data.sentiment import load_sentiment
from rankwise.data.split import clean, hash_split
from rankwise.data.tokenizer import TextEncoder
from rankwise.train.evaluate import evaluate


@dataclass
class Config:
    gpus: int = 2  # processes per node (one per GPU on a GPU machine)
    nodes: int = 1
    nr: int = 0  # this node's rank
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    max_len: int = 512
    batch_per_rank: int = 2  # long sequences: tiny per-rank batches ...
    accumulate: int = 4  # ... and accumulation for a useful optimizer batch
    max_steps: int = 20
    lr: float = 5e-4
    clip: float = 1.0
    save_every: int = 10
    documents: int = 400
    out: str = "runs/long-sequence"


def long_documents(count: int) -> tuple[list[str], list[int]]:
    """Join reviews of the same label until each document has ~1,000 characters."""
    records, _ = clean(load_sentiment())
    texts, labels = [], []
    for label in ("negative", "positive"):
        buffer = ""
        for record in (
            r for r in records if r.label == label and hash_split(r.text, 0, 10) == "train"
        ):
            buffer += record.text + "。"
            if len(buffer) >= 1000:
                texts.append(buffer)
                labels.append(int(label == "positive"))
                buffer = ""
            if len(texts) >= count * (1 + (label == "positive")) // 2:
                break
    return texts, labels


def build_model(vocab_size: int, max_len: int) -> nn.Module:
    from transformers import BigBirdConfig, BigBirdForSequenceClassification

    config = BigBirdConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=max_len,
        attention_type="block_sparse",
        block_size=16,
        num_random_blocks=2,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BigBirdForSequenceClassification(config)


def worker(gpu: int, cfg: Config) -> None:
    # BigBird's block-sparse path leaves a few parameters without gradients: DDP must be told.
    with rankwise.setup("ddp", seed=0, options={"find_unused_parameters": True}) as rt:
        texts, labels = long_documents(cfg.documents)
        encoder = TextEncoder.build("char", texts, 4000, cfg.max_len)
        data = TokenizedTextDataset(encoder.encode(texts), labels, encoder.pad_id)
        model = build_model(encoder.vocab_size, cfg.max_len)
        model, optimizer = rt.prepare(
            model,
            torch.optim.AdamW(model.parameters(), lr=cfg.lr),
            grad_accum=cfg.accumulate,
            micro_batch_size=cfg.batch_per_rank,
        )
        loader = rt.loader(data, cfg.batch_per_rank * rt.world_size, collate_fn=data.collate)
        writer = None
        if rt.is_main:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(Path(cfg.out) / "tensorboard"))
        bar = tqdm(total=cfg.max_steps, disable=not rt.is_main, desc="long-sequence")
        step, epoch = 0, 0
        while step < cfg.max_steps:
            rt.set_epoch(loader, epoch)
            for _, sync, batch in rankwise.iterate_steps(loader, cfg.accumulate):
                batch = rt.to_device(batch)
                labels_ = batch.pop("labels")
                batch.pop("index")
                with rt.no_sync(model, enabled=not sync):
                    loss = nn.functional.cross_entropy(model(**batch).logits, labels_)
                    rt.backward(loss / cfg.accumulate, model)
                if not sync:
                    continue
                rt.step(optimizer, model, max_norm=cfg.clip)  # clip the global norm, then step
                rt.zero_grad(optimizer)
                step += 1
                bar.update(1)
                if writer:
                    # rank 0's loss only: no collective per step
                    writer.add_scalar("loss", loss.item(), step)
                if step % cfg.save_every == 0:
                    rt.save_weights(model, Path(cfg.out) / f"step-{step}.safetensors")
                if step == cfg.max_steps:
                    break
            epoch += 1
        bar.close()
        result = evaluate(rt, model, data, ["negative", "positive"], 8, data.collate)
        rt.print(
            f"train-set accuracy {result.accuracy:.3f} on {result.samples} documents of up to "
            f"{cfg.max_len} tokens; {rt.world_size} processes x {cfg.batch_per_rank} x "
            f"{cfg.accumulate} accumulation"
        )
        if writer:
            writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name, default in vars(Config()).items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(default) if default is not None else int,
            default=default,
        )
    cfg = Config(**vars(parser.parse_args()))
    rankwise.spawn(
        worker,
        cfg.gpus,
        args=(cfg,),
        nnodes=cfg.nodes,
        node_rank=cfg.nr,
        master_addr=cfg.master_addr,
        master_port=cfg.master_port,
    )


if __name__ == "__main__":
    main()
