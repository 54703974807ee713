"""``rankwise launch``: any script on N processes / nodes, with torchrun's own flags."""

from __future__ import annotations

import argparse
import os

from rankwise.errors import ConfigError
from rankwise.launch import exits
from rankwise.launch.choice import OPTIONS, PRECISION, STRATEGY, Choice
from rankwise.launch.hosts import layout_from_slurm, node_layout
from rankwise.launch.torchrun import get_args_parser, launch_command_line
from rankwise.precision import PRECISIONS
from rankwise.process import gpus_too_few
from rankwise.strategies import lookup, strategy_names

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

A rank that finished its work and does not exit within --exit-grace seconds (default 30) is
named with where it waited and ended; the run then exits 3 (1: a rank failed, 0: all exited).

Strategy (read by rankwise.setup() in the script, which then needs no strategy of its own):
  --strategy NAME       any registered strategy or variant (below); default: ddp with several
                        processes, single with one
  --precision P         32-true | bf16-mixed | 16-mixed (default 32-true)
  --set SECTION.KEY=V   an option of the strategy's own section, e.g. --set ddp.bucket_cap_mb=50,
                        --set deepspeed.offload_optimizer=true (repeatable)
A script that passes its own strategy or precision to rankwise.setup() and contradicts these is
refused, naming both.

Strategies:
{strategies}

torchrun's flags:
"""


def strategies_help() -> str:
    """The strategies `rankwise launch` starts (a strategy with a launcher of its own is named
    apart)."""
    lines, elsewhere = [], []
    for name in strategy_names():
        variant = lookup(name)
        launcher = variant.settings.get("launch.launcher") or variant.cls.launcher or "torchrun"
        if launcher != "torchrun":
            elsewhere.append(f"{name} ({launcher})")
            continue
        one = "" if variant.cls.multiprocess else " (one process: --nproc-per-node 1)"
        lines.append(f"  {name:<18} {variant.description}{one}")
    if elsewhere:
        lines.append(f"  not started by `rankwise launch`: {', '.join(elsewhere)}")
    return "\n".join(lines)


def command_line_parser() -> argparse.ArgumentParser:
    """torchrun's parser with rankwise's strategy flags (a script's own flags after it stay the
    script's)."""
    parser = get_args_parser()
    parser.prog = "rankwise launch"
    # A script's own flag must never be taken for an abbreviation of torchrun's (a script's --even
    # is not --event-log-handler): torchrun's flags are matched whole.
    parser.allow_abbrev = False
    parser.add_argument("--strategy", choices=strategy_names(), metavar="NAME", help="see above")
    parser.add_argument("--precision", choices=PRECISIONS, help="see above")
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="see above"
    )
    parser.add_argument(
        "--exit-grace",
        type=float,
        metavar="SECONDS",
        default=float(os.environ.get(exits.GRACE) or exits.EXIT_GRACE_S),
        help="how long a rank that finished its work (destroyed its process group, or returned) "
        "may take to exit before it is named, with where it waits, and ended; the run then exits "
        f"{exits.HUNG_AT_EXIT} (0: no limit; default %(default)g)",
    )
    return parser


def run_command_line(argv: list[str]) -> int:
    """``rankwise launch ARGV``: torchrun's flags, rankwise's (--hostfile, --strategy, --precision,
    --set), then the script and its arguments."""
    if not argv or argv[0] in ("-h", "--help"):
        print(
            LAUNCH_HELP.format(strategies=strategies_help()) + command_line_parser().format_help()
        )
        return 0
    at = next((i for i, arg in enumerate(argv) if arg.split("=", 1)[0] == "--hostfile"), None)
    if at is not None:  # rankwise's own flag: the node layout as torchrun flags
        if "=" in argv[at]:
            given, width = argv[at].split("=", 1)[1], 1
        else:
            given, width = (argv[at + 1] if at + 1 < len(argv) else ""), 2
        if not given or given.startswith("-"):
            raise ConfigError("--hostfile needs a file")
        layout = node_layout(given)
        argv = argv[:at] + argv[at + width :]
    else:  # under srun with one task per node, this task is the node's agent: Slurm's layout
        layout = layout_from_slurm(os.environ) or {}
    # Put first, so flags given after them win.
    argv = [f"--{key.replace('_', '-')}={value}" for key, value in layout.items()] + argv
    parser = command_line_parser()
    flags, _ = parser.parse_known_args(argv)  # the choice is checked before any process starts
    # torchrun's "gpu"/"auto" take one process per GPU by themselves
    counted = str(flags.nproc_per_node).isdigit()
    nproc = int(flags.nproc_per_node) if counted else 2  # "gpu"/"auto": several
    choice = Choice.from_flags(
        flags.strategy,
        flags.precision,
        flags.set,
        world_size=nproc * int(str(flags.nnodes).split(":")[-1]),
    )
    sharing = (
        gpus_too_few(nproc)
        if counted and flags.strategy and lookup(flags.strategy).cls.multiprocess
        else None
    )
    if sharing:  # a script on rankwise.setup(): refused here rather than by NCCL in every rank
        raise ConfigError(f"--nproc-per-node: {sharing}")
    for variable in (STRATEGY, PRECISION, OPTIONS):
        os.environ.pop(variable, None)  # the workers inherit this process's environment
    os.environ.update(choice.environment())
    if not (flags.exit_grace == 0 or 1 <= flags.exit_grace < float("inf")):  # (nan fails both)
        raise ConfigError(
            f"--exit-grace: {flags.exit_grace:g} seconds; give 0 (no limit) or at least 1"
        )
    os.environ[exits.GRACE] = f"{flags.exit_grace:g}"
    launch_command_line(argv, parser)
    return 0


def add_parser(commands) -> None:
    # Listed in `rankwise --help` only: `rankwise launch` itself is parsed by torchrun (see main).
    commands.add_parser(
        "launch",
        add_help=False,
        help="start a script on N processes / nodes (torchrun flags)",
        description="rankwise launch [torchrun flags] SCRIPT.py [script args]",
    )
