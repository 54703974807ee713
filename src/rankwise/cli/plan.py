"""``rankwise plan``: how your script scales before you have the hardware."""

from __future__ import annotations

import argparse
import time

from rankwise.cli import paths, script_args
from rankwise.precision import PRECISIONS
from rankwise.tools.plan import command, devices
from rankwise.tools.plan.config import PlanConfig, known, parse_sizes, planned

DESCRIPTION = """\
Plan SCRIPT's training at other world sizes and on other devices, without running it there: per
rank, per strategy and per world size, the memory by kind (parameters, gradients, optimizer
state, activations at the peak, communication buffers) against the device's memory, the bytes
each collective carries per step, and the step time split into compute and the communication
computation does not hide; the fastest strategy that fits, and for one that does not, the
cheapest change that makes it fit.

The script runs here up to its first training forward with every parameter fake (shapes, no
memory: an 8B-parameter model plans on a laptop), then the step is replayed on fake tensors and
measured.  FSDP is measured on fake ranks with torch's FSDPMemTracker; DDP, DeepSpeed ZeRO and
Horovod are formulas over the measured step, each with its source (see docs/how-to/plan.md).
Writes plan.md, plan.json and plan.png under --out.

--validate runs the real strategies at the world sizes this machine can run (1-2 CPU ranks
here), measures peak tensor memory and steady step time, and prints them against the plan.

  rankwise plan examples/causal_lm.py
  rankwise plan examples/llama_pretrain.py --nproc-per-node 8,64,512 --device h100 \\
      --precision bf16-mixed --micro-batch 1 -- --size 8b --length 4096
  rankwise plan examples/causal_lm.py --validate
"""


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        default="1,2",
        metavar="N,N,...",
        help="ranks per node to plan, a comma-separated list (default 1,2)",
    )
    p.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="nodes (default 1); world size = nnodes x nproc-per-node",
    )
    p.add_argument(
        "--strategies",
        default="",
        metavar="NAME,NAME",
        help=f"strategies to plan (default: every installed one of {', '.join(planned())}); "
        f"known: {', '.join(known())}",
    )
    p.add_argument(
        "--precision", choices=PRECISIONS, default="32-true", help="the precision (default 32-true)"
    )
    p.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="plan with each transformer layer's activations recomputed in the backward pass",
    )
    p.add_argument(
        "--device",
        choices=devices.names(),
        help="the device to plan for (default: the one present)",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=0.1,
        help="share of the device's memory left free (default 0.1)",
    )
    p.add_argument(
        "--efficiency",
        type=float,
        help="share of the peak FLOP/s the step runs at (default: the device's stated one)",
    )
    p.add_argument(
        "--comm",
        type=paths.absolute,
        metavar="COMM.JSON",
        help="bandwidths measured by rankwise comm bench instead of the device's link",
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        metavar="ROWS",
        help="samples per rank per micro-batch at every world size (default: the script's global "
        "batch split over the ranks)",
    )
    p.add_argument(
        "--no-timing",
        action="store_true",
        help="on the CPU, use FLOPs at the stated efficiency instead of timing the model's passes "
        "here",
    )
    p.add_argument(
        "--validate",
        action="store_true",
        help="also run the strategies here at 1 and 2 ranks and print measured against planned",
    )
    p.add_argument("--out", help="report directory (default runs/plan-<time>)")
    p.add_argument(
        "--json", action="store_true", help="print a JSON summary as the last stdout line"
    )


def add_parser(commands) -> None:
    p = commands.add_parser(
        "plan",
        help="memory and step time per strategy and world size, before running there",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="rankwise plan SCRIPT.py [options] [-- SCRIPT ARGS]",
    )
    _options(p)
    script_args.add_rest(p)
    p.set_defaults(run=run)


def config_from(args: argparse.Namespace) -> PlanConfig:
    return PlanConfig(
        # paths against the user's directory, before any process starts (cli/paths.py)
        script=paths.absolute(args.script),
        script_args=list(paths.script_arguments(args.script_args)),
        nproc_per_node=parse_sizes(args.nproc_per_node),
        nnodes=args.nnodes,
        strategies=[s.strip() for s in args.strategies.split(",") if s.strip()],
        precision=args.precision,
        activation_checkpointing=args.activation_checkpointing,
        device=args.device,
        headroom=args.headroom,
        efficiency=args.efficiency,
        comm=args.comm,
        micro_batch=args.micro_batch,
        no_timing=args.no_timing,
        out=paths.absolute(args.out or f"runs/plan-{time.strftime('%Y%m%d-%H%M%S')}"),
    )


def parse_rest(args: argparse.Namespace) -> argparse.Namespace:
    """The options given after SCRIPT, the script, and its arguments after ``--``."""
    return script_args.parse_rest(args, _options)


def run(args: argparse.Namespace) -> int:
    args = parse_rest(args)
    config = config_from(args)
    if args.validate:
        from rankwise.tools.plan import validate

        return validate.run(config, as_json=args.json)
    return command.run(config, as_json=args.json)
