"""``rankwise verify``: does your script on N ranks compute what it computes on one process?"""

from __future__ import annotations

import argparse

from rankwise.precision import PRECISIONS
from rankwise.tools.verify import command

DESCRIPTION = """\
Run SCRIPT (written on rankwise.setup()) with --strategy on --nproc-per-node ranks, then on
one process in lockstep with it: the same seed and global batches, each step started from
the N-rank run's weights, its gradient compared with the one process's there and then
applied.  So a step shows only what distribution changed in that step, never rounding
compounded over the steps before (Adam at its default eps turns summation-order noise into
weight differences above 1e-5 within a few steps).  After every optimizer step it compares
the samples each step took, its loss, the gradient the N-rank optimizer received (relative
to the whole gradient's size) and every tensor of the weights after the step.  It reports
the first step where they part beyond the stated tolerances, the tensors that differ most,
and what in the script explains it: BatchNorm and other batch-dependent layers, random ops
drawing different numbers per rank, a loss averaged per micro-batch instead of per global
batch, gradients summed instead of averaged or compressed by a DDP comm hook, gradients
accumulated in 16 bits, a data loader that is not rank-sharded, a learning-rate schedule
that does not drive the optimizer that steps, parameters without gradients.

Dropout modules are switched off (p=0) in both runs, so random masks cannot hide the
verdict; --keep-dropout keeps them.  Exit 0: equivalent; 1: not equivalent, or a run
failed; 3: not comparable (random ops rankwise cannot switch off, such as F.dropout).
Writes verify.md, verify.json and verify.png (the differences by step) under --out.

  rankwise verify train.py --strategy ddp --nproc-per-node 2 -- --lr 1e-3
  rankwise verify examples/image_cnn.py --strategy fsdp -- --batch-norm
"""


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strategy", metavar="NAME", help="the strategy to check (ddp, fsdp, ...)")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=2,
                   help="ranks of the distributed run (default 2)")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps to compare (default 5)")
    p.add_argument("--precision", choices=PRECISIONS, help="the precision of both runs (default: the script's)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="an option of the strategy's section for the distributed run, e.g. "
                        "ddp.find_unused_parameters=true (repeatable)")
    p.add_argument("--keep-dropout", action="store_true", help="leave dropout modules on in both runs")
    p.add_argument("--keep-weights", action="store_true", help="keep every step's weights and gradients under --out")
    p.add_argument("--out", help="report directory (default runs/verify-<script>-<strategy>-<time>)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each run may take (default 600)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON as the last stdout line")


def add_parser(commands) -> None:
    p = commands.add_parser("verify", help="find the step where N ranks stop matching one process, and why",
                            description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                            usage="rankwise verify SCRIPT.py --strategy NAME [options] [-- SCRIPT ARGS]")
    _options(p)
    # The script's own flags may follow it: everything from SCRIPT on is parsed again in run().
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="SCRIPT.py [-- SCRIPT ARGS]")
    p.set_defaults(run=run, verify_parser=p)


def parse_rest(args: argparse.Namespace) -> argparse.Namespace:
    """The options given after SCRIPT, the script, and its arguments after ``--``."""
    parser = argparse.ArgumentParser(prog="rankwise verify", usage=args.verify_parser.usage, add_help=False)
    _options(parser)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs="*")
    parser.set_defaults(**{k: v for k, v in vars(args).items() if k not in ("rest", "run", "command", "verify_parser")})
    ours = args.rest[:args.rest.index("--")] if "--" in args.rest else args.rest
    if "-h" in ours or "--help" in ours:
        args.verify_parser.print_help()
        args.verify_parser.exit(0)
    parsed = parser.parse_intermixed_args(args.rest)
    if parsed.strategy is None:
        parser.error("the following arguments are required: --strategy")
    return parsed


def run(args: argparse.Namespace) -> int:
    return command.run(parse_rest(args))
