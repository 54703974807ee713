"""A stock script that ends with its DDP model alive and its process group open (no
destroy_process_group)."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(nn.Linear(4, 2))
model(torch.randn(3, 4)).sum().backward()
Path(sys.argv[1], f"rank{dist.get_rank()}.json").write_text(
    json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "file": __file__})
)
