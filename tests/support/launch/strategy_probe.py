"""Launched by the tests: ``rankwise.setup()`` with no strategy of its own; every rank writes what
it got."""

import json
import sys
from pathlib import Path


def main(out_dir: str, *own: str) -> None:
    import torch

    import rankwise

    # a strategy named in the script itself, to contradict the launcher
    strategy = own[0] if own else None
    with rankwise.setup(strategy) as rt:
        model = torch.nn.Linear(4, 2)
        model, _ = rt.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        options = rt.strategy.options.model_dump() if rt.strategy.options is not None else None
        seen = {
            "strategy": rt.strategy_name,
            "precision": rt.strategy.precision.name,
            "options": options,
            "world_size": rt.world_size,
            "wrapper": type(model).__name__,
        }
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, f"rank-{rt.rank}.json").write_text(json.dumps(seen), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
