"""Started on the Slurm tests' nodes (by srun, or by `rankwise launch` under srun): joins the job
through rankwise.setup(), sums the ranks with an all_reduce, and prints what this rank sees as one
JSON line.

With ``--loop FILE TIMEOUT_S`` it then keeps all-reducing, rank 0 adding a line to FILE after each
round, until the job is ended from outside (the killed-node test); collectives give up after
TIMEOUT_S.
"""

import json
import socket
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str]) -> None:
    import rankwise

    loop = argv[:1] == ["--loop"]
    with rankwise.setup(timeout_s=float(argv[2]) if loop else 60.0) as rt:
        # every rank must take part
        total = rt.all_reduce(torch.tensor([float(rt.rank + 1)]), "sum").item()
        hosts = rt.all_gather_object(socket.gethostname())
        seen = {
            "rank": rt.rank,
            "local_rank": rt.local_rank,
            "world_size": rt.world_size,
            "source": rt.env.source,
            "host": socket.gethostname(),
            "hosts": hosts,
            "sum": total,
            "master": f"{rt.env.master_addr}:{rt.env.master_port}",
        }
        # One write per line: ranks of a node share one stdout, and print's separate newline could
        # interleave.
        sys.stdout.write(json.dumps(seen) + "\n")
        sys.stdout.flush()
        rounds = 0
        while loop:
            rt.all_reduce(torch.ones(1024))  # blocks while a peer is gone, until the timeout
            rounds += 1
            if rt.is_main:
                with open(Path(argv[1]), "a", encoding="utf-8") as progress:
                    progress.write(f"{rounds}\n")
            time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1:])
