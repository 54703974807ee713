"""rankwise comm: the collective operations, demonstrated and verified, or benchmarked.

  rankwise comm demo                       every operation on 2 ranks, before/after per rank,
  PASS/FAIL rankwise comm demo --nproc-per-node 3 --op scatter --op all_reduce rankwise comm demo
  --composed            each operation built from simpler ones, checked the same way rankwise comm
  bench                      all_reduce, all_gather, reduce_scatter, all_to_all, broadcast,
                                           reduce from 4 B to 256 MiB, against this machine's
                                           ceilings
  rankwise comm bench --ops all_reduce --max-bytes 64M --dtype bfloat16 --iters 50

Across nodes: the same command on every node with --nnodes N --node-rank i --master-addr
<node 0> --master-port P (rank 0's node prints and writes the results).
"""

from __future__ import annotations

import argparse

from rankwise.cli import paths, smoke
from rankwise.cli.node_flags import add_node_flags, node_layout
from rankwise.tools.comm import bench, demo, sizes
from rankwise.tools.harness import check_layout, resolve_backend


def add_parser(commands) -> None:
    p = commands.add_parser(
        "comm",
        help="the collective operations: demonstrated and verified, or benchmarked",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="comm_command", required=True, metavar="demo|bench")

    d = sub.add_parser(
        "demo",
        help="run every collective on every rank and check each result",
        description="Run each collective operation on every rank, print every rank's tensor "
        "before and after (one ordered block per operation) and check it against "
        "a value computed without communicating. Exit 1 if any check fails.",
    )
    add_node_flags(d, backend=True)
    d.add_argument(
        "--op",
        action="append",
        metavar="NAME",
        help="only this operation (repeatable); a family name such as 'reduce' selects every "
        "ReduceOp",
    )
    d.add_argument(
        "--composed",
        action="store_true",
        help="run each operation's composition from simpler operations instead of the native call",
    )
    d.set_defaults(run=run_demo, command_name="comm demo")

    b = sub.add_parser(
        "bench",
        help="time the collectives over message sizes, with ceilings",
        description=bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_node_flags(b, backend=True)
    b.add_argument(
        "--ops",
        default=",".join(bench.OPS),
        metavar="OP,OP",
        help=f"operations (default all): {', '.join(bench.OPS)}",
    )
    b.add_argument(
        "--min-bytes",
        type=sizes.parse_size,
        default=4,
        metavar="SIZE",
        help="smallest message (default 4)",
    )
    b.add_argument(
        "--max-bytes",
        type=sizes.parse_size,
        default=sizes.parse_size("256M"),
        metavar="SIZE",
        help="largest message (default 256M); sizes double from the smallest",
    )
    b.add_argument("--dtype", choices=list(bench.DTYPES), default="float32")
    b.add_argument("--iters", type=int, default=20, help="timed calls per size (default 20)")
    b.add_argument("--warmup", type=int, default=5, help="untimed calls before them (default 5)")
    b.add_argument(
        "--no-ceilings", action="store_true", help="skip the loopback TCP and memcpy measurements"
    )
    b.add_argument("--out", type=paths.absolute, help="report directory (default runs/comm-<time>)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument(
        "--json", action="store_true", help="print comm.json's summary as the last stdout line"
    )
    b.set_defaults(run=run_bench, command_name="comm bench")


def run_demo(args: argparse.Namespace) -> int:
    layout = check_layout(node_layout(args))
    return demo.run(
        args.op, args.composed, layout, resolve_backend(args.backend, layout.nproc_per_node)
    )


def run_bench(args: argparse.Namespace) -> int:
    layout = check_layout(node_layout(args))
    if smoke.on():  # RANKWISE_SMOKE=1 (cli/smoke.py)
        args.max_bytes = min(args.max_bytes, smoke.COMM_MAX_BYTES)
        args.min_bytes = min(args.min_bytes, args.max_bytes)
        args.iters = smoke.cap(args.iters, smoke.COMM_ITERS)
        args.warmup = smoke.cap(args.warmup, 1)
        smoke.say("comm bench", f"messages up to {args.max_bytes} B, {args.iters} timed calls")
    backend = resolve_backend(args.backend, layout.nproc_per_node)
    settings = bench.settings(
        args.ops,
        args.min_bytes,
        args.max_bytes,
        args.dtype,
        args.iters,
        args.warmup,
        backend,
        layout.timeout_s,
        progress=not args.no_progress,
    )
    return bench.run(
        settings, layout, out=args.out, ceilings=not args.no_ceilings, as_json=args.json
    )
