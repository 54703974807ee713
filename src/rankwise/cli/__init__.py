"""rankwise: one PyTorch training loop on every data-parallel strategy.

Commands
  rankwise train    train and evaluate a text (or toy) classifier with any strategy
  rankwise launch   start any script on N processes / nodes, like torchrun
  rankwise predict  classify texts with a trained checkpoint
  rankwise export   write a checkpoint's weights as one plain .safetensors file
  rankwise doctor   check this machine, or every node of a multi-node job, before a run
  rankwise bench    every strategy on one job: speed, memory, accuracy, equivalence to one process
  rankwise verify   where your script on N ranks stops matching one process, step by step, and why
  rankwise comm     the collective operations: `comm demo` shows and checks each, `comm bench`
                    times them
  rankwise plan     memory and step time per strategy and world size, before you have the hardware

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
  rankwise verify my_script.py --strategy fsdp --nproc-per-node 2 -- --my-arg 1
  rankwise comm demo --nproc-per-node 3
  rankwise comm bench --ops all_reduce --max-bytes 64M
  rankwise plan examples/causal_lm.py --nproc-per-node 8,64 --device h100 --precision bf16-mixed
  rankwise predict --checkpoint runs/<name>/checkpoints/latest "这本书很好看" "质量太差了"
"""

from __future__ import annotations

import argparse
import os
import sys

from rankwise.cli import bench, comm, doctor, export, launch, plan, predict, smoke, train, verify
from rankwise.errors import USAGE, USER_ERRORS, exit_code
from rankwise.logs import to_terminal

COMMANDS = (train, launch, predict, export, doctor, bench, verify, comm, plan)
"""One module per command: ``add_parser(commands)`` registers it with ``set_defaults(run=...)``."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankwise", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    to_terminal()  # rankwise's messages (logging) printed as the commands always have
    smoke.take()  # RANKWISE_SMOKE: this command at a smoke size (the documentation tests)
    # torchrun's flags and the script's own arguments, parsed by torchrun
    if argv and argv[0] == "launch":
        command, run = "launch", lambda: launch.run_command_line(argv[1:])
    else:
        args = build_parser().parse_args(argv)
        command, run = getattr(args, "command_name", args.command), lambda: args.run(args)
    try:
        return run()
    except USER_ERRORS as e:
        code = exit_code(e)
        prefix = "error: " if code == USAGE else ""
        # The command's own last word on stderr with its exit code, not a library message: a plain
        # write.
        print(f"rankwise {command}: {prefix}{e}", file=sys.stderr)
        return code


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
