"""User data files: CSV, TSV and JSONL with a text column and a label column.

Everything is checked here, in the launching process, before any worker starts: the
file must be UTF-8, non-empty, have the named columns, and every row must be well
formed.  The first problem found is raised as a :class:`DataError` naming file and line.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from rankwise.data.records import DataError, Record

SPLIT_ALIASES = {
    "train": "train",
    "training": "train",
    "dev": "dev",
    "val": "dev",
    "valid": "dev",
    "validation": "dev",
    "eval": "dev",
    "test": "test",
}
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def read_text_utf8(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(path, "file not found") from None
    except IsADirectoryError:
        raise DataError(path, "is a directory, expected a .csv, .tsv or .jsonl file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(
            path,
            f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); re-encode the file "
            "as UTF-8",
            line,
        ) from None
    text = text.removeprefix("\ufeff")  # a BOM from spreadsheet exports
    if not text.strip():
        raise DataError(path, "the file is empty")
    return text


def _split_value(path: Path, line: int, value) -> str:
    key = str(value).strip().lower()
    if key not in SPLIT_ALIASES:
        raise DataError(path, f"unknown split {value!r}; use train, dev or test", line)
    return SPLIT_ALIASES[key]


def _record(path: Path, line: int, text, label, split_value, split_column: str | None) -> Record:
    if text is None or not str(text).strip():
        raise DataError(path, "empty text", line)
    if label is None or str(label).strip() == "":
        raise DataError(path, "empty label", line)
    split = _split_value(path, line, split_value) if split_column else None
    return Record(str(text).strip(), str(label).strip(), split, f"{path}:{line}")


def read_delimited(
    path: Path, delimiter: str, text_column: str, label_column: str, split_column: str | None
) -> list[Record]:
    content = read_text_utf8(path)
    reader = csv.reader(io.StringIO(content, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except csv.Error as e:
        raise DataError(path, f"malformed header: {e}", 1) from None
    header = [h.strip() for h in header]
    wanted = [c for c in (text_column, label_column, split_column) if c]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise DataError(
            path,
            f"missing column(s) {', '.join(map(repr, missing))}; the header has "
            f"{', '.join(map(repr, header))} (set data.text_column / data.label_column)",
            1,
        )
    positions = {c: header.index(c) for c in wanted}
    records = []
    while True:
        start_line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise DataError(path, f"malformed row: {e}", reader.line_num) from None
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise DataError(
                path, f"malformed row: {len(row)} fields, the header has {len(header)}", start_line
            )
        records.append(
            _record(
                path,
                start_line,
                row[positions[text_column]],
                row[positions[label_column]],
                row[positions[split_column]] if split_column else None,
                split_column,
            )
        )
    if not records:
        raise DataError(path, "no data rows after the header")
    return records


def read_jsonl(
    path: Path, text_column: str, label_column: str, split_column: str | None
) -> list[Record]:
    content = read_text_utf8(path)
    records = []
    for line_no, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(path, f"malformed JSON: {e.msg} (column {e.colno})", line_no) from None
        if not isinstance(row, dict):
            raise DataError(
                path, f"expected a JSON object per line, got {type(row).__name__}", line_no
            )
        for column in (text_column, label_column, split_column):
            if column and column not in row:
                raise DataError(
                    path,
                    f"missing key {column!r}; this line has {', '.join(map(repr, row))} (set "
                    "data.text_column / data.label_column)",
                    line_no,
                )
        records.append(
            _record(
                path,
                line_no,
                row[text_column],
                row[label_column],
                row.get(split_column) if split_column else None,
                split_column,
            )
        )
    if not records:
        raise DataError(path, "no records")
    return records


def read_file(
    path: str | Path,
    text_column: str = "text",
    label_column: str = "label",
    split_column: str | None = None,
) -> list[Record]:
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(path, f"unsupported file type {path.suffix!r}; use .csv, .tsv or .jsonl")
    if fmt == "jsonl":
        return read_jsonl(path, text_column, label_column, split_column)
    return read_delimited(
        path, "," if fmt == "csv" else "\t", text_column, label_column, split_column
    )
