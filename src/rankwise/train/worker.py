"""What each rank of ``rankwise train`` runs: load the prepared run directory, train, evaluate.

Started as ``python -m rankwise.train.worker RUN_DIR`` by torchrun and horovodrun, or as
``main([RUN_DIR])`` in each process by the spawn launcher.  When torchrun restarts the worker group
after a failure (``--max-restarts``), or when a node joins an elastic job, the new workers continue
from the run's latest checkpoint.  A worker stopped by SIGTERM / SIGINT checkpoints and exits with
128 + signal.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from rankwise.data.prepare import PreparedData
from rankwise.logs import to_terminal
from rankwise.testing import faults
from rankwise.train.config import load_config_json
from rankwise.train.loop import run_training
from rankwise.train.rundir import RunDir


def train_from_run_dir(run_dir: str | Path) -> dict:
    layout = RunDir(Path(run_dir))
    cfg = load_config_json(layout.config)
    # A restarted group (or one a node joined) continues from the latest checkpoint:
    # Trainer.latest_to_continue.
    return run_training(cfg, PreparedData.load(layout.data), layout.root, faults.step_end_hooks())


@record  # writes this rank's traceback where torchrun's failure summary finds it
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m rankwise.train.worker RUN_DIR")
    to_terminal()  # a rank of `rankwise train`: its messages on the terminal, as the command's own
    summary = train_from_run_dir(argv[0])
    if summary.get("preempted"):
        sys.exit(128 + summary["preempted"])  # after a clean teardown; the checkpoint is written


if __name__ == "__main__":
    main()
