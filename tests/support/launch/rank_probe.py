"""Launched by the tests: every rank writes a file named after its rank with what it sees."""

import json
import os
import sys
from pathlib import Path


def main(out_dir: str) -> None:
    import rankwise

    with rankwise.setup("ddp") as rt:
        keys = (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "OMP_NUM_THREADS",
        )
        seen = {key: os.environ.get(key) for key in keys}
        seen["runtime"] = [rt.rank, rt.local_rank, rt.world_size]
        Path(out_dir, f"rank-{rt.rank}.json").write_text(json.dumps(seen), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
