"""Accuracy and speed of the default `sentiment` run, next to a TF-IDF baseline on the same split.

Runs ``rankwise train --data sentiment --strategy ddp --nproc-per-node 2 --json`` (any
extra arguments are passed on) for each seed, end to end, and prints test accuracy,
macro-F1, wall time (data preparation and process start included) and training
throughput.  The baseline is a character 1-3-gram TF-IDF logistic regression::

    python -m rankwise.tools.bench.sentiment_baseline --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rankwise.tools.harness import run_train
from rankwise.tools.machine import machine


def tfidf_baseline() -> dict:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    from rankwise.data.prepare import load_records
    from rankwise.data.split import assign_splits, clean
    from rankwise.train.config import DataConfig

    config = DataConfig()
    records, _ = clean(load_records(config))
    splits = assign_splits(records, config.dev_percent, config.test_percent)
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True, min_df=2)
    x_train = vectorizer.fit_transform([r.text for r in splits["train"]])
    classifier = LogisticRegression(C=4.0, max_iter=2000).fit(
        x_train, [r.label for r in splits["train"]]
    )
    predicted = classifier.predict(vectorizer.transform([r.text for r in splits["test"]]))
    truth = [r.label for r in splits["test"]]
    return {
        "accuracy": accuracy_score(truth, predicted),
        "macro_f1": f1_score(truth, predicted, average="macro"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--nproc", type=int, default=2)
    args, extra = parser.parse_known_args(argv)

    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="rankwise-sentiment-") as out:
            summary = run_train(
                [
                    "--data",
                    "sentiment",
                    "--strategy",
                    "ddp",
                    "--nproc-per-node",
                    str(args.nproc),
                    "--seed",
                    str(seed),
                    *extra,
                ],
                Path(out),
            )
        if "error" in summary:
            sys.exit(f"seed {seed} failed: {summary['error']}")
        wall = summary["wall_s"]
        summary["wall_s"] = round(wall, 1)
        rows.append(summary)
        print(
            f"seed {seed}: accuracy {summary['accuracy']:.4f}, macro-F1 {summary['macro_f1']:.4f}, "
            f"wall {wall:.0f} s, {summary['samples_per_s']} samples/s, {summary['parameters']:,} "
            "parameters",
            flush=True,
        )
    baseline = tfidf_baseline()
    print(
        "TF-IDF char 1-3-gram logistic regression on the same split: accuracy "
        f"{baseline['accuracy']:.4f}, macro-F1 {baseline['macro_f1']:.4f}"
    )
    print(json.dumps({"runs": rows, "tfidf": baseline, **machine()}))


if __name__ == "__main__":
    main()
