"""rankwise: one PyTorch training loop on every data-parallel strategy.

Commands
  rankwise train    train and evaluate a text (or toy) classifier with any strategy
  rankwise launch   start any script on N processes / nodes, like torchrun
  rankwise predict  classify texts with a trained checkpoint
  rankwise export   write a checkpoint's weights as one plain .safetensors file
  rankwise doctor   check this machine, or every node of a multi-node job, before a run
  rankwise bench    every strategy on one job: speed, memory, accuracy, equivalence to one process
  rankwise comm     the collective operations: `comm demo` shows and checks each, `comm bench` times them

Concepts
  world_size   number of processes in the job (nnodes x nproc_per_node)
  rank         a process's index in the job, 0 .. world_size-1; rank 0 logs and saves
  local_rank   index on its own machine; chooses the GPU (cuda:<local_rank>)
  node_rank    index of the machine, 0 .. nnodes-1
  master_addr / master_port
               where rank 0 hosts the rendezvous; every node must reach it

Examples
  rankwise train --data sentiment --strategy ddp --nproc-per-node 2
  rankwise train --data sentiment --strategy ddp --nproc-per-node 2 --launcher spawn
  rankwise train --data my.csv --strategy single --epochs 3 --json
  rankwise train --config run.toml --set optim.lr=1e-3 --set data.max_length=128
  rankwise launch --nproc-per-node 2 my_script.py --my-arg 1
  rankwise comm demo --nproc-per-node 3
  rankwise comm bench --ops all_reduce --max-bytes 64M
  rankwise predict --checkpoint runs/<name>/checkpoints/latest "这本书很好看" "质量太差了"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rankwise import checks
from rankwise.checkpoint import write_text_atomic
from rankwise.config import LAUNCHERS, ConfigError, TrainConfig, build_config, describe_fields
from rankwise.data.records import DataError
from rankwise.precision import PRECISIONS
from rankwise.rundir import RunDir

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


def _add_train_parser(commands) -> None:
    from rankwise.strategies import lookup, strategy_names

    strategies = "\n".join(f"  {name:<16} {lookup(name).description}" for name in strategy_names())
    p = commands.add_parser(
        "train", help="train and evaluate a classifier with a data-parallel strategy",
        description="Train and evaluate a classifier.\n\nStrategies:\n" + strategies,
        epilog=EPILOG_TRAIN + _config_reference(), formatter_class=argparse.RawDescriptionHelpFormatter)
    flag = lambda *names, key, **kw: p.add_argument(*names, dest=key, default=None, **kw)  # noqa: E731
    flag("--data", key="data.source", metavar="SOURCE", help="sentiment | toy | PATH.csv/.tsv/.jsonl")
    flag("--strategy", key="strategy", choices=strategy_names(), help="data-parallel strategy (default single)")
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
    flag("--resume", key="resume", help="checkpoint directory, or 'latest' for <out>/checkpoints/latest")
    flag("--strict", key="strict", action="store_const", const=True,
         help="on resume, refuse a corrupt latest checkpoint instead of falling back to the previous one")
    flag("--nproc-per-node", "--nproc_per_node", key="launch.nproc_per_node", type=int)
    flag("--nnodes", key="launch.nnodes", metavar="N|MIN:MAX", help="nodes; MIN:MAX for an elastic c10d job")
    flag("--node-rank", "--node_rank", key="launch.node_rank", type=int)
    flag("--master-addr", "--master_addr", key="launch.master_addr")
    flag("--master-port", "--master_port", key="launch.master_port", type=int)
    flag("--rdzv-backend", key="launch.rdzv_backend")
    flag("--rdzv-endpoint", key="launch.rdzv_endpoint")
    flag("--rdzv-id", key="launch.rdzv_id")
    flag("--max-restarts", key="launch.max_restarts", type=int)
    p.add_argument("--hostfile", metavar="FILE", help="'host slots=N' per line: nnodes, this node's rank and "
                   "processes and the master (the first host) from the file; the same command on every node")
    flag("--launcher", key="launch.launcher", choices=[name for name in LAUNCHERS if name != "horovodrun"])
    p.add_argument("--config", metavar="FILE.toml", help="TOML file with any of the keys below")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print one JSON summary object as the last stdout line")


def _add_launch_parser(commands) -> None:
    commands.add_parser(
        "launch", add_help=False, help="start a script on N processes / nodes (torchrun flags)",
        description="rankwise launch [torchrun flags] SCRIPT.py [script args]")


def _add_predict_parser(commands) -> None:
    p = commands.add_parser("predict", help="classify texts with a trained checkpoint",
                            description="Classify texts with a checkpoint written by `rankwise train`.")
    p.add_argument("--checkpoint", required=True, help="checkpoint dir, .../checkpoints/latest or a run dir")
    p.add_argument("texts", nargs="*", help="texts to classify (read one per line from stdin when none)")
    p.add_argument("--json", action="store_true", help="one JSON object per text")


def _add_export_parser(commands) -> None:
    p = commands.add_parser("export", help="write a checkpoint's full weights as one plain .safetensors file",
                            description="Export plain, unwrapped fp32 weights from a checkpoint written by any "
                                        "strategy (FSDP shards and DeepSpeed ZeRO partitions included). The file "
                                        "carries architecture, labels and tokenizer in its metadata: use it with "
                                        "`predict --checkpoint FILE` or `train --set model.init_weights=FILE`.")
    p.add_argument("--checkpoint", required=True, help="checkpoint dir, .../checkpoints/latest or a run dir")
    p.add_argument("--out", required=True, help="output .safetensors file")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rankwise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train_parser(commands)
    _add_launch_parser(commands)
    _add_predict_parser(commands)
    _add_export_parser(commands)
    from rankwise import doctor
    from rankwise.bench import command as bench
    from rankwise.comm import command as comm

    doctor.add_parser(commands)
    bench.add_parser(commands)
    comm.add_parser(commands)
    return parser


# -- train ---------------------------------------------------------------------------------------

def default_run_dir(cfg: TrainConfig) -> Path:
    if cfg.out:
        return Path(cfg.out)
    source = Path(cfg.data.source).stem if cfg.data.source not in ("sentiment", "toy") else cfg.data.source
    name = cfg.name or f"{source}-{cfg.strategy}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path("runs") / name


def cmd_train(args: argparse.Namespace) -> int:
    """check -> prepare -> launch -> report."""
    from rankwise.launch import LaunchError, Stopped

    started = time.perf_counter()
    cfg = check_train(args)
    run_dir = prepare_run(cfg, quiet=args.json)
    try:
        launch_workers(cfg, run_dir.root)
    except LaunchError as e:
        print(f"rankwise train: {e}", file=sys.stderr)
        return 1
    except Stopped as e:
        latest = run_dir.latest.resolve() if run_dir.latest.exists() else None
        where = f"the last checkpoint is {latest}" if latest else "no checkpoint was written"
        print(f"rankwise train: {e}; {where}; continue with the same command and --resume latest", file=sys.stderr)
        return e.exit_code
    return report_run(cfg, run_dir, time.perf_counter() - started, as_json=args.json)


def check_train(args: argparse.Namespace) -> TrainConfig:
    """The validated configuration; everything refusable before reading data is refused here."""
    flags = {k: v for k, v in vars(args).items() if "." in k or k in TrainConfig.model_fields}
    if args.no_progress:
        flags["progress"] = False
    for key, value in node_layout(args.hostfile).items():  # a hostfile or a Kubernetes pod's layout
        if flags.get(f"launch.{key}") is None:
            flags[f"launch.{key}"] = value
    cfg = build_config(args.config, args.set, flags)
    checks.before_launch(cfg)
    cfg.out = str(default_run_dir(cfg))
    checks.resumable(cfg)
    return cfg


def node_layout(hostfile: str | None) -> dict:
    """Launch settings this node takes from a hostfile, else from a Kubeflow PyTorchJob pod's variables."""
    from dataclasses import asdict

    from rankwise.launch.hosts import layout_from_hostfile, layout_from_kubeflow

    if hostfile:
        return asdict(layout_from_hostfile(hostfile))
    return layout_from_kubeflow(os.environ) or {}


def prepare_run(cfg: TrainConfig, quiet: bool = False) -> RunDir:
    """Read, validate, split and tokenize the data here, once: bad input fails before any worker starts."""
    from rankwise.data.prepare import prepare_data

    run_dir = RunDir(cfg.out)
    if cfg.resume is None and run_dir.result.exists() and not quiet:
        print(f"note: {run_dir.root} already holds a finished run; it will be overwritten", file=sys.stderr)
    data = prepare_data(cfg.data)
    checks.prepared_data(cfg, {split: data.size(split) for split in ("train", "dev", "test")})
    run_dir.root.mkdir(parents=True, exist_ok=True)
    if cfg.resume is None and run_dir.checkpoints.exists():
        # A fresh run must not resume (after a restart) from, or be pruned against, another run's checkpoints.
        aside = run_dir.root / f"checkpoints-replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir.checkpoints.rename(aside)
        print(f"note: the earlier run's checkpoints were moved to {aside}", file=sys.stderr)
    data.save(run_dir.data)
    write_text_atomic(run_dir.config, cfg.to_json())
    for warning in data.stats.get("warnings", []):
        print(f"warning: {cfg.data.source}: {warning}", file=sys.stderr)
    if not quiet:
        counts = ", ".join(f"{s} {data.size(s)}" for s in ("train", "dev", "test"))
        print(f"data: {cfg.data.source}: {counts} ({data.stats.get('duplicates_removed', 0)} duplicates and "
              f"{data.stats.get('contradictory_texts_removed', 0)} contradictory texts removed)", flush=True)
    return run_dir


def report_run(cfg: TrainConfig, run_dir: RunDir, wall_s: float, as_json: bool) -> int:
    if not run_dir.result.exists():  # a node other than the one holding rank 0
        node = "this node" if cfg.launch.rdzv_backend else f"node {cfg.launch.node_rank}"
        print(f"{node}: workers finished; rank 0's report is on the node that holds rank 0")
        return 0
    summary = json.loads(run_dir.result.read_text(encoding="utf-8"))
    summary["wall_s"] = round(wall_s, 2)
    write_text_atomic(run_dir.result, json.dumps(summary, indent=2))
    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
        return 0
    print(run_dir.report_txt.read_text(encoding="utf-8"))
    print(f"{summary['strategy']} x{summary['world_size']}: accuracy {summary['accuracy']:.4f}, macro-F1 "
          f"{summary['macro_f1']:.4f} on {summary['eval_samples']} {summary['eval_split']} samples; "
          f"{summary['samples_per_s']} samples/s; wall {summary['wall_s']} s")
    print(f"report: {run_dir.report_md}\ncheckpoint: {summary['checkpoint']}")
    return 0


def launch_workers(cfg: TrainConfig, run_dir: Path) -> None:
    """Start the workers (or, for a one-process strategy, train right here)."""
    from rankwise.strategies import get_strategy

    strategy = get_strategy(cfg.strategy)
    if not strategy.multiprocess:
        from rankwise.launch import Stopped
        from rankwise.launch.worker import train_from_run_dir

        summary = train_from_run_dir(run_dir)
        if summary.get("preempted"):
            raise Stopped(summary["preempted"])
        return
    lc = cfg.launch
    if lc.check_collectives:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"  # the workers inherit it
    launcher = strategy.launcher or lc.launcher
    if launcher == "horovodrun":
        from rankwise.launch.horovodrun import launch as horovodrun

        horovodrun(lc.nproc_per_node, ["-m", "rankwise.launch.worker", str(run_dir)], nnodes=lc.nnodes,
                   master_addr=lc.master_addr, master_port=lc.master_port)
        return
    if launcher == "spawn":
        from rankwise.launch.spawn import spawn
        from rankwise.launch.worker import spawn_worker

        spawn(spawn_worker, lc.nproc_per_node, (str(run_dir),), nnodes=lc.nnodes, node_rank=lc.node_rank,
              master_addr=lc.master_addr, master_port=lc.master_port, rdzv_timeout_s=lc.timeout_s)
        return
    from rankwise.launch.torchrun import launch, torchrun_argv

    launch(torchrun_argv(lc.nproc_per_node, ["-m", "rankwise.launch.worker", str(run_dir)], nnodes=lc.nnodes,
                         node_rank=lc.node_rank, master_addr=lc.master_addr, master_port=lc.master_port,
                         max_restarts=lc.max_restarts, rdzv_backend=lc.rdzv_backend,
                         rdzv_endpoint=lc.rdzv_endpoint, rdzv_id=lc.rdzv_id,
                         rdzv_timeout_s=lc.timeout_s if cfg.world_size > lc.nproc_per_node else None))


# -- launch --------------------------------------------------------------------------------------

LAUNCH_HELP = """\
usage: rankwise launch [torchrun flags] SCRIPT.py [script args]
       rankwise launch [torchrun flags] -m MODULE [module args]

Start SCRIPT on --nproc-per-node processes (per node) with RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, exactly like torchrun
(its elastic agent runs in this process).  On one node a free --master-port is chosen
when none is given, and OMP_NUM_THREADS defaults to usable cores / processes.

Multi-node: run the same command on every node with --nnodes N --node-rank i
--master-addr <node 0 address> --master-port <port>, or with --rdzv-backend c10d
--rdzv-endpoint host:port --rdzv-id JOB, or with --hostfile hosts.txt ('host slots=N'
per line; the first host is the master).  The network interface that routes to the
master is chosen for gloo / NCCL unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME are set.

torchrun's flags:
"""


def cmd_launch(argv: list[str]) -> int:
    from rankwise.launch import LaunchError, Stopped
    from rankwise.launch.torchrun import get_args_parser, launch

    if not argv or argv[0] in ("-h", "--help"):
        print(LAUNCH_HELP + get_args_parser().format_help())
        return 0
    at = next((i for i, arg in enumerate(argv) if arg.split("=", 1)[0] == "--hostfile"), None)
    if at is not None:  # rankwise's own flag: the node layout as torchrun flags
        if "=" in argv[at]:
            given, width = argv[at].split("=", 1)[1], 1
        else:
            given, width = (argv[at + 1] if at + 1 < len(argv) else ""), 2
        if not given or given.startswith("-"):
            print("rankwise launch: error: --hostfile needs a file", file=sys.stderr)
            return 2
        layout = node_layout(given)
        argv = [f"--{key.replace('_', '-')}={value}" for key, value in layout.items()] + argv[:at] + argv[at + width:]
    try:
        launch(argv)
    except LaunchError as e:
        print(f"rankwise launch: {e}", file=sys.stderr)
        return 1
    except Stopped as e:
        print(f"rankwise launch: {e}", file=sys.stderr)
        return e.exit_code
    return 0


# -- predict -------------------------------------------------------------------------------------

def cmd_predict(args: argparse.Namespace) -> int:
    from rankwise.predict import Predictor

    texts = args.texts or [line.strip() for line in sys.stdin if line.strip()]
    if not texts:
        raise ConfigError("no texts given (as arguments or on stdin)")
    predictor = Predictor.from_checkpoint(args.checkpoint)
    for text, prediction in zip(texts, predictor.predict(texts)):
        if args.json:
            print(json.dumps({"text": text, **prediction}, ensure_ascii=False))
        else:
            print(f"{prediction['label']}\t{prediction['probability']:.4f}\t{text}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from rankwise.checkpoint import export

    path = export(args.checkpoint, args.out)
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "launch":
        return cmd_launch(argv[1:])
    args = build_parser().parse_args(argv)
    from rankwise.checkpoint import CheckpointError

    try:
        if args.command == "train":
            return cmd_train(args)
        if args.command == "export":
            return cmd_export(args)
        if args.command == "doctor":
            from rankwise import doctor

            return doctor.run(args)
        if args.command == "bench":
            from rankwise.bench import command as bench

            return bench.run(args)
        if args.command == "comm":
            from rankwise.comm import command as comm

            return comm.run(args)
        return cmd_predict(args)
    except (ConfigError, DataError, CheckpointError) as e:
        print(f"rankwise {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
