"""verify_cases.py, the script the tests of `rankwise verify`, `rankwise bench --script` and a
crashed launch run."""

from __future__ import annotations

from pathlib import Path

CASES = Path(__file__).with_name("verify_cases.py")


def loader_line() -> int:
    """The line of verify_cases.py that builds its loader with rt.loader (where a bad batch size is
    reported)."""
    return next(
        number
        for number, line in enumerate(CASES.read_text().splitlines(), 1)
        if "loader = rt.loader(dataset, batch_size=micro_batch" in line
    )
