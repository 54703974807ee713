"""A DDP script that finishes its work and then does not exit.

``gil``: as ``main()`` returns, freeing its last object keeps the GIL and never returns (what
freeing a gloo group does when its worker thread waits for the GIL: the deadlock of Accelerate's
quick tour); ``thread``: after the script returned, the interpreter waits for a thread that never
ends; ``none``: it exits.  Each rank writes ``rankN.done`` in DIR once its work is done.
"""

import argparse
import ctypes
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("directory")
parser.add_argument("--hang", choices=["gil", "thread", "none"], default="gil")
parser.add_argument("--ranks", default="all", help="which ranks hang: all, or one rank's number")
parser.add_argument(
    "--work-after",
    type=float,
    default=0.0,
    help="seconds rank 0 computes alone (in Python, and in torch) after destroying its group",
)
args = parser.parse_args()


class HoldsTheGil:
    """Its finaliser blocks in C with the GIL held (ctypes.PyDLL calls keep it), as
    ~ProcessGroupGloo's join does."""

    def __del__(self):
        ctypes.PyDLL(None).sleep(3600)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    world, rank = dist.get_world_size(), dist.get_rank()
    for _ in range(3):
        optimizer.zero_grad()
        # the global batch, drawn alike everywhere; each rank trains on its share of it
        batch = torch.randn(8 * 2, 4).chunk(world)[rank]
        model(batch).pow(2).mean().backward()
        optimizer.step()
    hangs = args.ranks == "all" or int(args.ranks) == rank
    dist.destroy_process_group()
    started = time.monotonic()
    # work, not a hang: the GIL changes hands
    while rank == 0 and time.monotonic() - started < args.work_after:
        sum(i * i for i in range(10_000))
        torch.randn(256, 256) @ torch.randn(256, 256)
    Path(args.directory, f"rank{rank}.done").write_text("done")
    if hangs and args.hang == "thread":
        threading.Thread(target=threading.Event().wait, name="never-ends").start()
    holder = HoldsTheGil() if hangs and args.hang == "gil" else None  # noqa: F841 (freed as main() returns)


main()
