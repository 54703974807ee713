"""``rankwise verify``: does your script on N ranks compute what it computes on one process?"""

from __future__ import annotations

import argparse
import shlex

from rankwise.cli import paths, script_args, smoke
from rankwise.precision import PRECISIONS
from rankwise.tools.verify import command
from rankwise.tools.verify.settings import VerifySettings
from rankwise.tools.watch.frameworks import FRAMEWORKS
from rankwise.tools.watch.stall import STALL_TIMEOUT_S

DESCRIPTION = """\
Run SCRIPT on --nproc-per-node ranks, then on one process in lockstep with it, and check the
whole script: does N ranks' run compute and report what one process would?

The first --steps optimizer steps (default 5) are compared with one process: the same seed and
global batches, each step started from the N-rank run's weights (step 0 included: an
initialisation that differs run to run is a reproducibility warning, not a difference), its
gradient compared with the one process's there and then applied. So a step shows only what
distribution changed in that step, never rounding compounded over the steps before. After every
step it compares the samples, the loss, the gradient the N-rank optimizer received (relative to
the whole gradient's size) and every tensor of the weights after the step, and lists every cause
it has evidence for, each with the step it first shows in: BatchNorm and other batch-dependent
layers, random ops drawing different numbers per rank, a loss averaged per micro-batch or scaled
by the world size, gradients summed or compressed, 16-bit gradients, a loader that is not
rank-sharded, data that differs per process (the same dataset index, other tensors), a schedule
that does not drive the optimizer that steps, parameters without gradients. Steps in which
nothing trained (a loss of exactly 0, zero gradients, weights that never change) prove nothing:
"vacuous".

After those steps the N-rank run goes on through the rest of the script: its later epochs,
evaluation, saves and shutdown. Each later training pass is cut to two optimizer steps' batches
(evaluation runs whole), so this takes bounded time; --as-written runs it as written. What needs
no reference is checked there: processes that never joined a process group, a training loader
that is not sharded, a shuffling DistributedSampler without set_epoch, evaluation counted more
than once or on one rank's shard only, replicas whose weights differ, checkpoints written by
every rank or with DDP's 'module.' keys, sync points on every step. The report lists what of the
script ran and which checks could not run, and why.

Any training script, unchanged: plain torch (started as torchrun would), Accelerate, Hugging
Face Trainer, Lightning Trainer or Fabric (as its launcher would; detected from its imports,
--framework overrides), with a probe that watches torch itself.  Its one-process reference runs
the same script with each training DataLoader taking N times its batch and, batch by batch, the
samples the N ranks took together.  A script that starts its own ranks with mp.spawn starts as
`python script.py` starts itself, its spawned children watched, on the world size and port it
sets (not --nproc-per-node); its reference runs that mp.spawn with nprocs=1 at world size 1.
A DeepSpeed-engine script (deepspeed.initialize) is stepped at engine.step(), DeepSpeed naming
each parameter's whole gradient and fp32 weights (ZeRO 0-3); its reference runs the same config
at world size 1.  A Horovod script starts as horovodrun --gloo starts it, each step at its
DistributedOptimizer's step, on the gradients Horovod averaged.  A script on rankwise.setup()
is checked under --strategy.

Dropout modules are switched off (p=0) in both runs; --keep-dropout keeps them.  One verdict
line, and the exit code it states: 0 equivalent; 1 not equivalent, or a finding in the script
that changes what it computes or reports; 3 not comparable (random ops rankwise cannot switch
off, such as F.dropout); 4 could not run (a run crashed: its error, once, and where the script
made the call); 5 vacuous (nothing trained in the compared steps).  A rank that makes no
progress (no forward, batch, backward or optimizer step) for --stall-timeout seconds (default
120; from its start to its first forward too) is stopped, and the report says where each rank
waited: never a silent hang until --timeout.
Writes verify.md, verify.json and verify.png (the differences by step) under --out.

  rankwise verify my_ddp_script.py
  rankwise verify accelerate_script.py --nproc-per-node 2 -- --epochs 3
  rankwise verify train.py --strategy ddp --nproc-per-node 2 -- --lr 1e-3
  rankwise verify examples/image_cnn.py --strategy fsdp -- --batch-norm
"""


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--strategy",
        metavar="NAME",
        help="for a script on rankwise.setup(): the strategy to check (ddp, fsdp, ...)",
    )
    p.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default="auto",
        help="how the script trains, so it starts as its launcher would (default: from its "
        "imports)",
    )
    p.add_argument(
        "--reference-args",
        metavar="'ARGS'",
        type=shlex.split,
        help="the script's arguments for the one-process reference, when its batching cannot be "
        "scaled by N (e.g. --reference-args='--batch-size 64'); its loaders are then left as they "
        "are",
    )
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=int,
        default=2,
        help="ranks of the distributed run (default 2)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=5,
        help="optimizer steps compared with one process (default 5); the distributed run then "
        "goes on through the rest of the script",
    )
    p.add_argument(
        "--as-written",
        action="store_true",
        help="after the compared steps, run the rest of the script as written (default: each later "
        "training pass is cut to two optimizer steps' batches; evaluation runs whole)",
    )
    p.add_argument(
        "--precision", choices=PRECISIONS, help="the precision of both runs (default: the script's)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="an option of the strategy's section for the distributed run, e.g. "
        "ddp.find_unused_parameters=true (repeatable)",
    )
    p.add_argument(
        "--keep-dropout", action="store_true", help="leave dropout modules on in both runs"
    )
    p.add_argument(
        "--keep-weights",
        action="store_true",
        help="keep every step's weights and gradients under --out",
    )
    p.add_argument(
        "--out", help="report directory (default runs/verify-<script>-<strategy>-<time>)"
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds each run may take (default 600)"
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=STALL_TIMEOUT_S,
        metavar="SECONDS",
        help="stop a rank that makes no progress for this long, and say where each rank waited "
        f"(default {STALL_TIMEOUT_S:g}; 0: never)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the verdict as JSON as the last stdout line"
    )


def add_parser(commands) -> None:
    p = commands.add_parser(
        "verify",
        help="find the step where N ranks stop matching one process, and why",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="rankwise verify SCRIPT.py [--strategy NAME] [options] [-- SCRIPT ARGS]",
    )
    _options(p)
    # The script's own flags may follow it: everything from SCRIPT on is parsed again in run().
    script_args.add_rest(p)
    p.set_defaults(run=run)


def parse_rest(args: argparse.Namespace) -> argparse.Namespace:
    """The options given after SCRIPT, the script, and its arguments after ``--``."""
    return script_args.parse_rest(args, _options)


def settings_from(args: argparse.Namespace) -> VerifySettings:
    """The typed settings the flags describe (the tools see no argparse namespace)."""
    return VerifySettings(
        # paths against the user's directory: the runs start in verify's scratch (cli/paths.py)
        script=paths.absolute(args.script),
        script_args=paths.script_arguments(args.script_args),
        strategy=args.strategy,
        framework=args.framework,
        reference_args=paths.script_arguments(args.reference_args)
        if args.reference_args is not None
        else None,
        nproc_per_node=args.nproc_per_node,
        steps=args.steps,
        as_written=args.as_written,
        precision=args.precision,
        overrides=tuple(paths.overrides(args.set)),
        keep_dropout=args.keep_dropout,
        keep_weights=args.keep_weights,
        out=paths.absolute_or_none(args.out),
        timeout_s=args.timeout,
        stall_s=args.stall_timeout,
        as_json=args.json,
    )


def run(args: argparse.Namespace) -> int:
    args = parse_rest(args)
    if smoke.on():  # RANKWISE_SMOKE=1 (cli/smoke.py)
        args.steps = smoke.cap(args.steps, smoke.VERIFY_STEPS)
        smoke.say("verify", f"{args.steps} compared steps")
    return command.run(settings_from(args))
