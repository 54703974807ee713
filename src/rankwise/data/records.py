"""Labelled text records (reading them raises :class:`~rankwise.errors.DataError`)."""

from __future__ import annotations

from dataclasses import dataclass

from rankwise.errors import DataError

__all__ = ["DataError", "Record"]


@dataclass(frozen=True)
class Record:
    text: str
    label: str
    split: str | None = None
    """train/dev/test when the file gives one, else None (hash split)."""
    source: str = ""
    """file:line the record came from, for error messages."""
