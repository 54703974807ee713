"""Labelled text records and the errors raised while reading them."""

from __future__ import annotations

from dataclasses import dataclass


class DataError(ValueError):
    """Bad input data; the message names the file and, where there is one, the line."""

    def __init__(self, path, message: str, line: int | None = None):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


@dataclass(frozen=True)
class Record:
    text: str
    label: str
    split: str | None = None
    """train/dev/test when the file gives one, else None (hash split)."""
    source: str = ""
    """file:line the record came from, for error messages."""
