"""``rankwise train``: its command line, turned into one validated configuration."""

from __future__ import annotations

import argparse

from rankwise.cli import paths, smoke
from rankwise.launch.config import LAUNCHERS
from rankwise.launch.hosts import node_layout
from rankwise.precision import PRECISIONS
from rankwise.strategies import lookup, strategy_names
from rankwise.train.config import TrainConfig, build_config, describe_fields

EPILOG_TRAIN = """\
The global --batch-size is the same whatever the number of processes: each rank gets
batch_size / (world_size x grad_accum) samples per micro-batch, so a 2-rank run takes
exactly the optimizer steps of a 1-process run with the same seed.

Outputs (under --out, default runs/<name>/): metrics.jsonl, tensorboard/, report.md,
report.txt, result.json, checkpoints/step-N/ with checkpoints/latest pointing at the newest.

Every config key can be set in a TOML file (--config) or with --set key=value;
explicit flags win over --set, which wins over the file.  Keys:
"""


def _config_reference() -> str:
    rows = describe_fields(TrainConfig)
    width = max(len(key) for key, _, _ in rows)
    return "\n".join(f"  {key:<{width}}  {doc} (default {default})" for key, default, doc in rows)


def add_parser(commands) -> None:
    strategies = "\n".join(f"  {name:<16} {lookup(name).description}" for name in strategy_names())
    p = commands.add_parser(
        "train",
        help="train and evaluate a classifier with a data-parallel strategy",
        description="Train and evaluate a classifier.\n\nStrategies:\n" + strategies,
        epilog=EPILOG_TRAIN + _config_reference(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flag = lambda *names, key, **kw: p.add_argument(*names, dest=key, default=None, **kw)  # noqa: E731
    flag(
        "--data", key="data.source", metavar="SOURCE", help="sentiment | toy | PATH.csv/.tsv/.jsonl"
    )
    flag(
        "--strategy",
        key="strategy",
        choices=strategy_names(),
        help="data-parallel strategy (default single)",
    )
    flag("--precision", key="precision", choices=PRECISIONS)
    flag("--epochs", key="epochs", type=int)
    flag("--max-steps", key="max_steps", type=int, help="stop after this many optimizer steps")
    flag("--batch-size", key="batch_size", type=int, help="global batch per optimizer step")
    flag("--grad-accum", key="grad_accum", type=int, help="micro-batches per optimizer step")
    flag("--lr", key="optim.lr", type=float)
    flag("--model", key="model.name", help="tiny | small | base | linear | mlp | LOCAL_PATH")
    flag("--seed", key="seed", type=int)
    flag("--out", key="out", help="run directory (default runs/<name>)")
    flag("--name", key="name", help="run name")
    flag(
        "--resume",
        key="resume",
        help="checkpoint directory, or 'latest' for <out>/checkpoints/latest",
    )
    flag(
        "--strict",
        key="strict",
        action="store_const",
        const=True,
        help="on resume, refuse a corrupt latest checkpoint instead of falling back to the "
        "previous one",
    )
    flag(
        "--trust-checkpoint",
        key="trust_checkpoint",
        action="store_const",
        const=True,
        help="on resume, load pickled files naming classes rankwise does not know (they could run "
        "code): only for a checkpoint from someone you trust",
    )
    flag("--nproc-per-node", "--nproc_per_node", key="launch.nproc_per_node", type=int)
    flag(
        "--nnodes",
        key="launch.nnodes",
        metavar="N|MIN:MAX",
        help="nodes; MIN:MAX for an elastic c10d job",
    )
    flag("--node-rank", "--node_rank", key="launch.node_rank", type=int)
    flag("--master-addr", "--master_addr", key="launch.master_addr")
    flag("--master-port", "--master_port", key="launch.master_port", type=int)
    flag("--rdzv-backend", key="launch.rdzv_backend")
    flag("--rdzv-endpoint", key="launch.rdzv_endpoint")
    flag("--rdzv-id", key="launch.rdzv_id")
    flag("--max-restarts", key="launch.max_restarts", type=int)
    p.add_argument(
        "--hostfile",
        metavar="FILE",
        help="'host slots=N' per line: nnodes, this node's rank and processes and the master (the "
        "first host) from the file; the same command on every node",
    )
    flag(
        "--launcher",
        key="launch.launcher",
        choices=[name for name in LAUNCHERS if name != "horovodrun"],
    )
    p.add_argument("--config", metavar="FILE.toml", help="TOML file with any of the keys below")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--json", action="store_true", help="print one JSON summary object as the last stdout line"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rankwise.train.run import train

    return train(config_from(args), as_json=args.json)


def config_from(args: argparse.Namespace) -> TrainConfig:
    """The configuration: the --config file, then --set, then the flags (explicit flags win)."""
    flags = {k: v for k, v in vars(args).items() if "." in k or k in TrainConfig.model_fields}
    if args.no_progress:
        flags["progress"] = False
    hostfile = str(paths.absolute(args.hostfile)) if args.hostfile else None
    # a hostfile or a Kubernetes pod's layout
    for key, value in node_layout(hostfile).items():
        if flags.get(f"launch.{key}") is None:
            flags[f"launch.{key}"] = value
    # paths against the user's directory, before any process starts (cli/paths.py)
    config_file = paths.absolute_or_none(args.config)
    overrides = paths.overrides(args.set)
    config = paths.config(build_config(config_file, overrides, flags))
    if smoke.on():
        flags["max_steps"] = smoke.cap(config.max_steps, smoke.TRAIN_STEPS)
        smoke.say("train", f"at most {flags['max_steps']} optimizer steps")
        config = paths.config(build_config(config_file, overrides, flags))
    return config
