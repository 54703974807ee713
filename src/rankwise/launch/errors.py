"""Failures of launched workers, summarised per rank."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """One or more ranks failed; the message names each failed rank and its error."""

    def __init__(self, failures: list[str]):
        self.failures = failures
        super().__init__("worker(s) failed:\n" + "\n".join(f"  {line}" for line in failures))
