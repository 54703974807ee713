"""``rankwise export``: a checkpoint's full weights as one plain safetensors file."""

from __future__ import annotations

import argparse

from rankwise.cli import paths


def add_parser(commands) -> None:
    p = commands.add_parser(
        "export",
        help="write a checkpoint's full weights as one plain .safetensors file",
        description="Export plain, unwrapped fp32 weights from a checkpoint written by any "
        "strategy (FSDP shards and DeepSpeed ZeRO partitions included). The file "
        "carries architecture, labels and tokenizer in its metadata: use it with "
        "`predict --checkpoint FILE` or `train --set model.init_weights=FILE`.",
    )
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint dir, .../checkpoints/latest or a run dir"
    )
    p.add_argument("--out", required=True, help="output .safetensors file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rankwise.train.artifacts import export

    path = export(paths.absolute(args.checkpoint), paths.absolute(args.out))
    print(f"wrote {path}")
    return 0
