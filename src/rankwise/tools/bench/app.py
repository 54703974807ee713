"""The built-in training app as a script on ``rankwise.setup()``: what ``rankwise bench`` has
``rankwise verify`` check for each of its rows.

  rankwise verify src/rankwise/tools/bench/app.py --strategy ddp -- DATA_DIR KEY=VALUE ...

It trains as ``rankwise train``'s workers do (:func:`rankwise.train.loop.run_training`) on the data
prepared in DATA_DIR (a ``data.cache_dir`` entry), with the configuration those ``--set`` overrides
give, under the strategy and precision its launcher chose (the overrides' own precision where the
launcher chose none).  Its run directory is ``run/`` under the working directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rankwise.data.prepare import PreparedData
from rankwise.launch.choice import Choice
from rankwise.train.config import build_config
from rankwise.train.loop import run_training


def main(argv: list[str] | None = None) -> dict:
    data_dir, *settings = sys.argv[1:] if argv is None else argv
    launched = Choice.from_environment()
    chosen = [
        f"strategy={launched.strategy or 'single'}",
        *([f"precision={launched.precision}"] if launched.precision else []),
        "progress=false",
    ]
    cfg = build_config(overrides=[*settings, *chosen])
    return run_training(cfg, PreparedData.load(data_dir), Path("run"))


if __name__ == "__main__":
    main()
