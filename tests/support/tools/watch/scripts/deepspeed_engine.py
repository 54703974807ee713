"""A DeepSpeed-engine script in the source documents' pattern, unchanged by rankwise:
deepspeed.init_distributed, deepspeed.initialize(model=..., model_parameters=..., config={...}) with
ZeRO and gradient clipping, a DistributedSampler, engine.backward(loss), engine.step(),
engine.save_checkpoint.  ``--stage`` and ``--bf16`` choose the config; ``--defective`` forgets
``sampler.set_epoch``; ``--unseeded`` builds the model unseeded."""

import argparse

import deepspeed
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--stage", type=int, default=2)
parser.add_argument("--bf16", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--defective", action="store_true")
parser.add_argument(
    "--unseeded", action="store_true", help="build the model before any seed is set"
)
parser.add_argument("--save", default="ds-checkpoint")
args = parser.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
if not args.unseeded:
    torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
config = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": args.stage},
    "bf16": {"enabled": args.bf16},
}
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
engine, optimizer, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), optimizer=optimizer, config=config
)
x = torch.randn(1024, 32, generator=torch.Generator().manual_seed(1))
data = TensorDataset(x, x[:, :4].argmax(1))
sampler = DistributedSampler(data, num_replicas=dist.get_world_size(), rank=dist.get_rank())
loader = DataLoader(data, batch_size=16, sampler=sampler)
dtype = torch.bfloat16 if args.bf16 else torch.float32
for epoch in range(args.epochs):
    if not args.defective:
        sampler.set_epoch(epoch)
    for features, labels in loader:
        loss = nn.functional.cross_entropy(engine(features.to(dtype)).float(), labels)
        engine.backward(loss)
        engine.step()
    if dist.get_rank() == 0:
        print(f"epoch {epoch}: loss {loss.item():.4f}")
engine.save_checkpoint(args.save)
