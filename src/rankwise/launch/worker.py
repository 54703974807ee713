"""What each rank of ``rankwise train`` runs: load the prepared run directory, train, evaluate.

Started as ``python -m rankwise.launch.worker RUN_DIR`` by torchrun, or called as
:func:`spawn_worker` by the spawn launcher.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from rankwise.config import load_config_json
from rankwise.data.prepare import PreparedData
from rankwise.loop import run_training
from rankwise.rundir import RunDir


def train_from_run_dir(run_dir: str | Path) -> dict:
    layout = RunDir(run_dir)
    return run_training(load_config_json(layout.config), PreparedData.load(layout.data), layout.root)


def spawn_worker(local_rank: int, run_dir: str) -> None:
    train_from_run_dir(run_dir)


@record  # writes this rank's traceback where torchrun's failure summary finds it
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m rankwise.launch.worker RUN_DIR")
    train_from_run_dir(argv[0])


if __name__ == "__main__":
    main()
