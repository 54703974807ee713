"""rankwise comm: the collective operations, demonstrated and verified, or benchmarked.

  rankwise comm demo                       every operation on 2 ranks, before/after per rank, PASS/FAIL
  rankwise comm demo --nproc-per-node 3 --op scatter --op all_reduce
  rankwise comm demo --composed            each operation built from simpler ones, checked the same way
  rankwise comm bench                      all_reduce, all_gather, reduce_scatter, all_to_all, broadcast,
                                           reduce from 4 B to 256 MiB, against this machine's ceilings
  rankwise comm bench --ops all_reduce --max-bytes 64M --dtype bfloat16 --iters 50

Across nodes: the same command on every node with --nnodes N --node-rank i --master-addr
<node 0> --master-port P (rank 0's node prints and writes the results).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from rankwise.comm.launch import add_launch_flags, check_layout, resolve_backend, start
from rankwise.errors import ConfigError


def add_parser(commands) -> None:
    p = commands.add_parser("comm", help="the collective operations: demonstrated and verified, or benchmarked",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="comm_command", required=True, metavar="demo|bench")

    demo = sub.add_parser("demo", help="run every collective on every rank and check each result",
                          description="Run each collective operation on every rank, print every rank's tensor "
                                      "before and after (one ordered block per operation) and check it against "
                                      "a value computed without communicating. Exit 1 if any check fails.")
    add_launch_flags(demo)
    demo.add_argument("--op", action="append", metavar="NAME",
                      help="only this operation (repeatable); a family name such as 'reduce' selects every ReduceOp")
    demo.add_argument("--composed", action="store_true",
                      help="run each operation's composition from simpler operations instead of the native call")

    from rankwise.comm import bench

    bench.add_arguments(sub.add_parser("bench", help="time the collectives over message sizes, with ceilings",
                                       description=bench.__doc__,
                                       formatter_class=argparse.RawDescriptionHelpFormatter))


def run(args: argparse.Namespace) -> int:
    from rankwise.launch import LaunchError

    check_layout(args)
    backend = resolve_backend(args.backend, args.nproc_per_node)
    try:
        if args.comm_command == "demo":
            return run_demo(args, backend)
        from rankwise.comm import bench

        return bench.run(args, backend)
    except LaunchError as e:  # a rank failed: name it, its host and its error, without our traceback
        print(f"rankwise comm {args.comm_command}: {e}", file=sys.stderr)
        return 1


def run_demo(args: argparse.Namespace, backend: str) -> int:
    from rankwise.comm import demo, ops

    try:
        ops.select(args.op)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    with tempfile.TemporaryDirectory(prefix="rankwise-comm-") as tmp:
        out_file = os.path.join(tmp, "demo.json")
        start(demo.worker, (args.op, args.composed, backend, args.timeout, out_file), args)
        if args.node_rank != 0:
            print(f"node {args.node_rank}: this node's ranks took part; node 0 printed the results")
            return 0
        with open(out_file, encoding="utf-8") as handle:
            results = json.load(handle)
    failed = [r["name"] for r in results if r["status"] == demo.FAIL]
    if failed:
        print(f"rankwise comm demo: {len(failed)} operation(s) returned a wrong result: {', '.join(failed)}",
              file=sys.stderr)
    return 1 if failed else 0
