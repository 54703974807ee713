"""Hugging Face Trainer on a tiny BERT classifier, every setting at its default but the sizes and
the step count.

``--unseeded`` builds the model before any seed is set, as most Trainer scripts do (Trainer seeds in
its own ``__init__``, after the model exists): two runs start from different weights."""

import argparse

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="trainer-out")
parser.add_argument(
    "--no-average-tokens",
    action="store_true",
    help="TrainingArguments(average_tokens_across_devices=False) (default: the library's, True)",
)
parser.add_argument(
    "--unseeded", action="store_true", help="build the model before any seed is set"
)
args = parser.parse_args()


class Texts(Dataset):
    def __init__(self, count: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, 100, (count, 16), generator=generator)
        self.labels = self.ids[:, 1] % 2

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones(16, dtype=torch.long),
            "labels": self.labels[i],
        }


config = BertConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
    attn_implementation="eager",
)
if not args.unseeded:
    torch.manual_seed(0)
model = BertForSequenceClassification(config)
training = TrainingArguments(
    output_dir=args.out,
    per_device_train_batch_size=8,
    max_steps=8,
    report_to=[],
    save_strategy="no",
    logging_steps=4,
    seed=0,
    **({"average_tokens_across_devices": False} if args.no_average_tokens else {}),
)
Trainer(model=model, args=training, train_dataset=Texts(96, 1), eval_dataset=Texts(32, 2)).train()
