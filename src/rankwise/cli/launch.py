"""``rankwise launch``: any script on N processes / nodes, with torchrun's own flags."""

from __future__ import annotations

from rankwise.errors import ConfigError
from rankwise.launch.hosts import node_layout
from rankwise.launch.torchrun import get_args_parser, launch_command_line

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


def run_command_line(argv: list[str]) -> int:
    """``rankwise launch ARGV``: torchrun's flags (and --hostfile), then the script and its arguments."""
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
            raise ConfigError("--hostfile needs a file")
        layout = node_layout(given)
        argv = [f"--{key.replace('_', '-')}={value}" for key, value in layout.items()] + argv[:at] + argv[at + width:]
    launch_command_line(argv)
    return 0


def add_parser(commands) -> None:
    # Listed in `rankwise --help` only: `rankwise launch` itself is parsed by torchrun (see main).
    commands.add_parser("launch", add_help=False, help="start a script on N processes / nodes (torchrun flags)",
                        description="rankwise launch [torchrun flags] SCRIPT.py [script args]")
