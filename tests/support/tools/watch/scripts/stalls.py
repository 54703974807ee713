"""A plain DDP loop (torchrun starts it) whose rank 0 stops making progress at its third step: it
sleeps there, and rank 1 waits for it in the gradients' all-reduce."""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    if dist.get_rank() == 0 and step == 2:
        time.sleep(3600)  # the stall
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
