"""An FSDP2 script as PyTorch's FSDP2 example writes one, for rankwise plan's capture: the model
built on the meta device, ``fully_shard`` on each block and on the root, the script checking that
it got an ``FSDPModule`` with sharded parameters, then ``to_empty`` and ``reset_parameters`` to
materialise it, and a summed loss.  Run it with torchrun (gloo on the CPU)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import Shard


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x):
        return x + self.mlp(self.norm(x))

    def reset_parameters(self):
        self.norm.reset_parameters()
        for layer in (self.mlp[0], self.mlp[2]):
            layer.reset_parameters()


class Model(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 16, depth: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(x)

    def reset_parameters(self):
        self.embed.reset_parameters()
        self.out.reset_parameters()
        for block in self.blocks:
            block.reset_parameters()


dist.init_process_group("gloo")
torch.manual_seed(0)
with torch.device("meta"):
    model = Model()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
assert isinstance(model, FSDPModule)
assert all(p.placements == (Shard(0),) for p in model.parameters())
model.to_empty(device="cpu")
model.reset_parameters()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for _ in range(3):
    tokens = torch.randint(0, 64, (8, 12))
    loss = model(tokens).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
