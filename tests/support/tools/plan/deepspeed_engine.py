"""A DeepSpeed script as DeepSpeedExamples' CIFAR-10 one writes it, for rankwise plan's capture: the
optimizer named in the config (torch's Adam: ``torch_adam``, DeepSpeed's FusedAdam compiles a
kernel first), ZeRO-2, and the step through the
engine (``engine(x)``, ``engine.backward``, ``engine.step``).  Run it with the deepspeed launcher or
torchrun."""

import deepspeed
import torch
from torch import nn

CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 2},
}

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
engine, optimizer, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=CONFIG
)
features = torch.randn(32, 16)
targets = (features[:, 0] > 0).long()
for start in range(0, 32, 8):
    loss = nn.functional.cross_entropy(
        engine(features[start : start + 8]), targets[start : start + 8]
    )
    engine.backward(loss)
    engine.step()
