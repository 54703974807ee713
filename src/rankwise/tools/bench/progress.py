"""What ``rankwise bench`` is doing now: one bar for its timed runs, then one for its equivalence
checks, each naming its row (and repeat, or check).  A terminal gets a live bar; a log (CI, ``make
demo > log``) one line per finished task, not per update."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Phase:
    """One phase's bar: ``start(task)`` names what runs now, ``status(text)`` updates its detail
    (the step it reached), ``finished(line)`` ends it (a log gets ``bench [3/8] line``)."""

    def __init__(self, name: str, total: int, enabled: bool = True):
        self.name, self.enabled = name, enabled
        self.live = enabled and sys.stderr.isatty()
        self.done = 0
        self.bar = tqdm(
            total=total, unit="run", disable=not self.live, dynamic_ncols=True, desc=name
        )

    @property
    def total(self) -> int:
        return int(self.bar.total or 0)

    def start(self, task: str) -> None:
        self.bar.set_description(f"{self.name} {task}")

    def status(self, text: str) -> None:
        self.bar.set_postfix_str(text, refresh=True)

    def finished(self, line: str) -> None:
        self.bar.update(1)
        self.done += 1
        if self.enabled and not self.live:
            # the bar's stand-in where stderr is not a terminal (the command's display, as the bar)
            print(f"{self.name} [{self.done}/{self.total}] {line}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
