"""``rankwise train`` end to end in the launching process: check, prepare, launch, report.

Everything refusable is refused before a worker starts (:mod:`rankwise.train.preflight`);
the data is read, split and tokenized here, once, into the run directory the workers read
(:mod:`rankwise.train.worker`); the workers start through the launcher table
(:mod:`rankwise.launch`); rank 0's summary becomes the report.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from rankwise.checkpoint import write_text_atomic
from rankwise.checkpoint.loading import TRUST_ENV
from rankwise.data.prepare import prepare_data
from rankwise.errors import Stopped
from rankwise.launch import Entry, launch
from rankwise.logs import get_logger
from rankwise.strategies import get_strategy
from rankwise.train import compiling, preflight
from rankwise.train.config import TrainConfig
from rankwise.train.rundir import LAUNCH_ID, RunDir
from rankwise.train.worker import train_from_run_dir

log = get_logger(__name__)

WORKER = "rankwise.train.worker"
"""The module every rank runs (``python -m rankwise.train.worker RUN_DIR``)."""


def train(cfg: TrainConfig, as_json: bool = False) -> int:
    """Check -> prepare -> launch -> report; returns the exit code (errors raise, see
    ``rankwise.errors``)."""
    started = time.perf_counter()
    preflight.before_launch(cfg)
    if cfg.trust_checkpoint:  # the workers read the checkpoint: they inherit the user's word
        os.environ[TRUST_ENV] = "1"
    cfg.out = str(default_run_dir(cfg))
    preflight.resumable(cfg)
    run_dir = prepare_run(cfg, quiet=as_json)
    # Rank 0 writes this into its result: nodes sharing one --out see the same result.json, and only
    # the node whose workers wrote it reports it (with c10d rendezvous any node may hold rank 0).
    os.environ[LAUNCH_ID] = uuid.uuid4().hex
    try:
        launch_workers(cfg, run_dir.root)
    except Stopped as e:
        latest = run_dir.latest.resolve() if run_dir.latest.exists() else None
        where = f"the last checkpoint is {latest}" if latest else "no checkpoint was written"
        raise Stopped(
            e.signum, f"{where}; continue with the same command and --resume latest"
        ) from None
    return report_run(cfg, run_dir, time.perf_counter() - started, as_json=as_json)


def default_run_dir(cfg: TrainConfig) -> Path:
    if cfg.out:
        return Path(cfg.out)
    source = (
        Path(cfg.data.source).stem
        if cfg.data.source not in ("sentiment", "toy")
        else cfg.data.source
    )
    name = cfg.name or f"{source}-{cfg.strategy}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path("runs") / name


def prepare_run(cfg: TrainConfig, quiet: bool = False) -> RunDir:
    """Read, validate, split and tokenize the data here, once: bad input fails before any worker
    starts."""
    assert cfg.out is not None  # train() set it (default_run_dir)
    run_dir = RunDir(Path(cfg.out))
    if cfg.resume is None and run_dir.result.exists() and not quiet:
        log.info(
            f"note: {run_dir.root} already holds a finished run; it will be overwritten",
            stderr=True,
        )
    data = prepare_data(cfg.data)
    preflight.prepared_data(cfg, {split: data.size(split) for split in ("train", "dev", "test")})
    preflight.continues_the_data(cfg, data)
    run_dir.root.mkdir(parents=True, exist_ok=True)
    if cfg.resume is None and run_dir.checkpoints.exists() and len(cfg.world_sizes) > 1:
        # An elastic job's nodes come and go with the same command: a node (re)joining must keep the
        # live run's checkpoints, which the workers continue from.
        log.info(
            f"note: {run_dir.checkpoints} is kept: an elastic job's workers continue from its "
            "latest checkpoint (a new job needs a new --out)",
            stderr=True,
        )
    elif cfg.resume is None and run_dir.checkpoints.exists():
        # A fresh run must not resume (after a restart) from, or be pruned against, another run's
        # checkpoints.
        aside = run_dir.root / f"checkpoints-replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            run_dir.checkpoints.rename(aside)
            log.info(f"note: the earlier run's checkpoints were moved to {aside}", stderr=True)
        except FileNotFoundError:  # another node sharing this --out moved them first
            pass
    data.save(run_dir.data)
    write_text_atomic(run_dir.config, cfg.to_json())
    for warning in data.stats.get("warnings", []):
        log.warning(f"warning: {cfg.data.source}: {warning}")
    if not quiet:
        counts = ", ".join(f"{s} {data.size(s)}" for s in ("train", "dev", "test"))
        log.info(
            f"data: {cfg.data.source}: {counts} ({data.stats.get('duplicates_removed', 0)} "
            f"duplicates and {data.stats.get('contradictory_texts_removed', 0)} contradictory "
            "texts removed)"
        )
    return run_dir


def launch_workers(cfg: TrainConfig, run_dir: Path) -> None:
    """Start the workers through the launcher table (a one-process strategy trains right here)."""
    strategy = get_strategy(cfg.strategy)
    if not strategy.multiprocess:
        summary = train_from_run_dir(run_dir)
        if summary.get("preempted"):
            raise Stopped(summary["preempted"])
        return
    if cfg.launch.check_collectives:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"  # the workers inherit it
    config = cfg.launch.model_copy(update={"launcher": strategy.launcher or cfg.launch.launcher})
    launch(config, Entry(WORKER, (str(run_dir),)))


def report_run(cfg: TrainConfig, run_dir: RunDir, wall_s: float, as_json: bool) -> int:
    summary = (
        json.loads(run_dir.result.read_text(encoding="utf-8")) if run_dir.result.exists() else {}
    )
    # a node other than the one holding rank 0
    if summary.get("launch_id") != os.environ[LAUNCH_ID]:
        node = "this node" if cfg.launch.rdzv_backend else f"node {cfg.launch.node_rank}"
        log.info(
            f"{node}: workers finished; rank 0's report is on the node that holds rank 0",
            every_rank=True,
        )
        return 0
    summary["wall_s"] = round(wall_s, 2)
    write_text_atomic(run_dir.result, json.dumps(summary, indent=2))
    # The command's output (its report), not messages: printed whatever the logging level.
    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
        return 0
    print(run_dir.report_txt.read_text(encoding="utf-8"))
    print(
        f"{summary['strategy']} x{summary['world_size']}: accuracy {summary['accuracy']:.4f}, "
        f"macro-F1 {summary['macro_f1']:.4f} on {summary['eval_samples']} {summary['eval_split']} "
        f"samples; {summary['samples_per_s']} samples/s; wall {summary['wall_s']} s"
    )
    if summary.get("tflops_per_s"):
        sheet = (
            f", {summary['mfu_datasheet']:.1%} of the datasheet's"
            if summary.get("mfu_datasheet")
            else ""
        )
        print(
            f"compute: {summary['tflops_per_s']:.4g} TFLOP/s in the steady steps "
            f"({summary['tflops_per_s_per_rank']:.4g} per rank); MFU {summary['mfu']:.1%} of the "
            f"{summary['peak_tflops_per_s']:.4g} TFLOP/s matrix-product peak measured here{sheet}"
        )
    compiled = compiling.line(summary)
    if compiled:
        print(compiled)
    print(f"report: {run_dir.report_md}\ncheckpoint: {summary['checkpoint']}")
    return 0
