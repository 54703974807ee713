"""``rankwise predict``: classify texts with a checkpoint of ``rankwise train``."""

from __future__ import annotations

import argparse
import json
import sys

from rankwise.cli import paths
from rankwise.errors import ConfigError


def add_parser(commands) -> None:
    p = commands.add_parser(
        "predict",
        help="classify texts with a trained checkpoint",
        description="Classify texts with a checkpoint written by `rankwise train`.",
    )
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint dir, .../checkpoints/latest or a run dir"
    )
    p.add_argument(
        "texts", nargs="*", help="texts to classify (read one per line from stdin when none)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per text")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rankwise.train.predict import Predictor

    texts = args.texts or [line.strip() for line in sys.stdin if line.strip()]
    if not texts:
        raise ConfigError("no texts given (as arguments or on stdin)")
    predictor = Predictor.from_checkpoint(paths.absolute(args.checkpoint))
    for text, prediction in zip(texts, predictor.predict(texts)):
        if args.json:
            print(json.dumps({"text": text, **prediction}, ensure_ascii=False))
        else:
            print(f"{prediction['label']}\t{prediction['probability']:.4f}\t{text}")
    return 0
