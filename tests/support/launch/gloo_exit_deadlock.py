"""gloo's exit deadlock, reached from an ordinary DDP script: its last collective is still in gloo's
worker thread when the group is destroyed, and the group's last owner is the DDP model's Reducer,
freed as ``main()`` returns.

``~ProcessGroupGloo`` then joins the worker thread while the main thread holds the GIL, and the
worker, freeing the collective's work (its tensors belong to Python too), waits for that GIL:
neither moves again.  Under torchrun this hangs in every run here (torch 2.13, gloo, 2 ranks).

``torch.distributed.nn`` is imported before the group exists, as a script that uses its functional
collectives does: imported later (DDP imports it on first use), its functions keep the default group
as a default argument until the interpreter exits, and the Reducer is then not the group's last
owner.
"""

import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 (see above)
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    model(torch.randn(2, 4)).sum().backward()
    if dist.get_rank() == 1:
        # rank 1 joins the last collective late: rank 0's worker thread is still in it
        time.sleep(0.5)
    features = torch.randn(4)
    gathered = [torch.empty_like(features) for _ in range(dist.get_world_size())]
    # its handle dropped: the worker thread holds the work
    dist.all_gather(gathered, features, async_op=True)
    dist.destroy_process_group()
    print(f"rank {model.device.type} work done", flush=True)


main()  # the model goes here, and with its Reducer the group
