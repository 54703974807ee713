"""Accuracy and speed of the default `sentiment` run, next to a TF-IDF baseline on the same split.

Runs ``rankwise train --data sentiment --strategy ddp --nproc-per-node 2 --json`` (any
extra arguments are passed on) for each seed, end to end, and prints test accuracy,
macro-F1, wall time (data preparation and process start included) and training
throughput.  The baseline is a character 1-3-gram TF-IDF logistic regression::

    python -m rankwise.bench.sentiment --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from rankwise.bench.common import machine


def tfidf_baseline() -> dict:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    from rankwise.config import DataConfig
    from rankwise.data.prepare import load_records
    from rankwise.data.split import assign_splits, clean

    config = DataConfig()
    records, _ = clean(load_records(config))
    splits = assign_splits(records, config.dev_percent, config.test_percent)
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True, min_df=2)
    x_train = vectorizer.fit_transform([r.text for r in splits["train"]])
    classifier = LogisticRegression(C=4.0, max_iter=2000).fit(x_train, [r.label for r in splits["train"]])
    predicted = classifier.predict(vectorizer.transform([r.text for r in splits["test"]]))
    truth = [r.label for r in splits["test"]]
    return {"accuracy": accuracy_score(truth, predicted), "macro_f1": f1_score(truth, predicted, average="macro")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--nproc", type=int, default=2)
    args, extra = parser.parse_known_args(argv)

    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="rankwise-sentiment-") as out:
            command = [sys.executable, "-m", "rankwise.cli", "train", "--data", "sentiment", "--strategy", "ddp",
                       "--nproc-per-node", str(args.nproc), "--seed", str(seed), "--out", out, "--json",
                       "--no-progress", *extra]
            started = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True)
            wall = time.perf_counter() - started
            if proc.returncode:
                sys.exit(f"seed {seed} failed:\n{proc.stderr[-4000:]}")
            summary = json.loads(proc.stdout.strip().splitlines()[-1])
        summary["wall_s"] = round(wall, 1)
        rows.append(summary)
        print(f"seed {seed}: accuracy {summary['accuracy']:.4f}, macro-F1 {summary['macro_f1']:.4f}, "
              f"wall {wall:.0f} s, {summary['samples_per_s']} samples/s, {summary['parameters']:,} parameters",
              flush=True)
    baseline = tfidf_baseline()
    print(f"TF-IDF char 1-3-gram logistic regression on the same split: accuracy {baseline['accuracy']:.4f}, "
          f"macro-F1 {baseline['macro_f1']:.4f}")
    print(json.dumps({"runs": rows, "tfidf": baseline, **machine()}))


if __name__ == "__main__":
    main()
