"""What every tool shares: its node flags, one way to run a function on N ranks (and nodes), and one
way to run ``rankwise train`` as a measured subprocess.

* :class:`NodeLayout` — this node's ranks and how the nodes meet (the node flags, parsed once in
  ``cli/``); :func:`check_layout` refuses one that cannot run, or takes Slurm's.
* :func:`run_on_ranks` — ``fn(env, device, *args)`` on every rank through the spawn launcher; rank
  0's JSON-able result comes back to node 0 (other nodes get ``None``); every rank tears its group
  down.
* :func:`run_train` / :func:`run_measured` — ``rankwise train ... --json`` (or a baseline loop) in
  fresh processes: its summary, or why it failed; killed with its workers past a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rankwise.errors import ConfigError, Stopped
from rankwise.launch.exits import HUNG_AT_EXIT
from rankwise.launch.hosts import layout_from_slurm
from rankwise.tools.stopping import ignored_stop_signals, stop_signals, stop_tree

if TYPE_CHECKING:
    from rankwise.process import ProcessEnv

BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_NPROC = 2
"""Ranks per node: a collective needs at least two."""


@dataclass(frozen=True)
class NodeLayout:
    """Where a tool's ranks run: this node's share of the job and how the nodes meet (the node
    flags, :func:`rankwise.cli.node_flags.add_node_flags`, parsed once)."""

    nproc_per_node: int = DEFAULT_NPROC
    """Ranks on this node."""
    nnodes: int = 1
    """Nodes in the job; the same command runs on each."""
    node_rank: int = 0
    """This node's index, 0 .. nnodes-1."""
    master_addr: str = "127.0.0.1"
    """Node 0's address."""
    master_port: int | None = None
    """Node 0's port (``None``: chosen free, on one node)."""
    timeout_s: float = 120.0
    """Seconds a rank waits for the others (rendezvous and each operation)."""

    @property
    def nodes_given(self) -> bool:
        """Whether any of the four node flags differs from its default (one node, its own
        master)."""
        default = NodeLayout()
        return any(
            getattr(self, key) != getattr(default, key)
            for key in ("nnodes", "node_rank", "master_addr", "master_port")
        )


def check_layout(layout: NodeLayout, min_ranks: int = 2) -> NodeLayout:
    """The layout to run, or a refusal of one that cannot run: before any process starts.  Under
    ``srun`` with one task per node and none of the node flags given, the layout is Slurm's
    (:func:`rankwise.launch.hosts.layout_from_slurm`)."""
    slurm = layout_from_slurm(os.environ)
    if slurm and not layout.nodes_given:
        layout = replace(layout, **slurm)
    if layout.nproc_per_node < 1 or layout.nnodes < 1:
        raise ConfigError("--nproc-per-node and --nnodes must be at least 1")
    if layout.nproc_per_node * layout.nnodes < min_ranks:
        raise ConfigError(
            f"this needs at least {min_ranks} ranks: use --nproc-per-node {min_ranks} (or more "
            "nodes)"
        )
    if not 0 <= layout.node_rank < layout.nnodes:
        raise ConfigError(f"--node-rank {layout.node_rank} is outside 0 .. {layout.nnodes - 1}")
    if layout.nnodes > 1 and layout.master_port is None:
        raise ConfigError("--nnodes > 1 needs --master-port (the same on every node)")
    return layout


def resolve_backend(backend: str, nproc_per_node: int = 1) -> str:
    """The backend to use: NCCL needs CUDA, a torch built with it and one GPU per local rank."""
    import torch.distributed as torch_dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = gpus > 0 and torch_dist.is_nccl_available()
    if backend == "auto":
        return "nccl" if nccl and gpus >= nproc_per_node else "gloo"
    if backend == "nccl" and not nccl:
        raise ConfigError(
            "--backend nccl needs CUDA GPUs and a torch built with NCCL; this machine has "
            + ("no CUDA device" if not gpus else "no NCCL")
            + " (use gloo)"
        )
    if backend == "nccl" and gpus < nproc_per_node:
        raise ConfigError(
            f"--backend nccl needs one GPU per rank: --nproc-per-node {nproc_per_node} on {gpus} "
            "GPU(s) (NCCL refuses two ranks on one GPU); use fewer ranks or gloo"
        )
    return backend


def join(local_rank: int, backend: str, timeout_s: float) -> tuple[ProcessEnv, torch.device]:
    """In a rank: join the job's process group on ``backend``; returns ``(ProcessEnv, device)``."""
    from rankwise.process import ProcessEnv, device_for, init_process_group

    env = ProcessEnv.detect()
    device = device_for(local_rank) if backend == "nccl" else torch.device("cpu")
    init_process_group(env, device, timeout_s)
    return env, device


def _rank_main(
    local_rank: int, fn: Callable, fn_args: tuple, backend: str, timeout_s: float, out_file: str
) -> None:
    from rankwise.logs import to_terminal
    from rankwise.process import destroy_process_group

    to_terminal()  # a rank of a command: rankwise's messages as the command prints them
    env, device = join(local_rank, backend, timeout_s)
    try:
        result = fn(env, device, *fn_args)
        if env.rank == 0:
            with open(out_file, "w", encoding="utf-8") as handle:
                json.dump(result, handle)
    except BaseException:
        destroy_process_group(clean=False)  # no barrier: the peers may be inside another collective
        raise
    destroy_process_group()


def run_on_ranks(
    fn: Callable[..., Any],
    fn_args: tuple,
    layout: NodeLayout,
    backend: str,
    master_port: int | None = None,
) -> Any | None:
    """Run ``fn(env, device, *fn_args)`` on this node's ranks, joined over ``backend`` with every
    node of the job; returns rank 0's result (JSON-able) on node 0 and ``None`` elsewhere.

    ``fn`` must be importable (a module-level function).  A failed rank raises
    :class:`~rankwise.errors.LaunchError` naming it, its host and its error.
    """
    from rankwise.launch.spawn import spawn

    with tempfile.TemporaryDirectory(prefix="rankwise-") as tmp:
        out_file = os.path.join(tmp, "rank0.json")
        spawn(
            _rank_main,
            layout.nproc_per_node,
            (fn, fn_args, backend, layout.timeout_s, out_file),
            nnodes=layout.nnodes,
            node_rank=layout.node_rank,
            master_addr=layout.master_addr,
            master_port=master_port or layout.master_port,
            rdzv_timeout_s=layout.timeout_s,
        )
        if layout.node_rank != 0:
            return None
        with open(out_file, encoding="utf-8") as handle:
            return json.load(handle)


def train_command(train_args: list[str], out: Path) -> list[str]:
    """The command line of ``rankwise train TRAIN_ARGS`` writing to ``out`` and printing its summary
    as JSON."""
    return [
        sys.executable,
        "-m",
        "rankwise.cli",
        "train",
        *train_args,
        "--out",
        str(out),
        "--json",
        "--no-progress",
    ]


def run_train(train_args: list[str], out: Path, **kwargs: Any) -> dict:
    """``rankwise train TRAIN_ARGS --out OUT --json`` in fresh processes (see
    :func:`run_measured`)."""
    return run_measured(train_command(train_args, out), out, **kwargs)


def run_measured(
    command: list[str],
    out: Path,
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 900.0,
    on_poll: Callable[[], None] | None = None,
    result_file: Path | None = None,
    cwd: Path | None = None,
) -> dict:
    """Run ``command`` (a ``rankwise train --json`` or a baseline loop) in fresh processes.

    Returns its result with ``wall_s``: the JSON of ``result_file`` when given, else its last stdout
    line (with ``hung_at_exit``: the launcher's lines for ranks that finished their work and were
    ended as they hung at exit); or ``{"error": why, "wall_s": ...}``.  Output goes to
    ``OUT/bench.out`` and ``OUT/bench.log`` (files, not pipes: a pipe nobody reads could stall the
    run); a run past ``timeout_s`` is killed with every worker it started.  ``on_poll`` is called
    about twice a second while it runs; ``cwd``: where it runs (its own relative outputs land
    there).
    """
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    started = time.perf_counter()
    with (
        open(out / "bench.out", "w", encoding="utf-8") as stdout,
        open(out / "bench.log", "w", encoding="utf-8") as stderr,
    ):
        # Its own session (a Ctrl-C in the terminal reaches this process, which stops the run as a
        # whole); a run that overstays, or a stop asked of this process, ends with every worker it
        # started.
        proc = None
        with stop_signals():
            try:
                proc = subprocess.Popen(
                    command,
                    stdout=stdout,
                    stderr=stderr,
                    text=True,
                    env=env,
                    start_new_session=True,
                    cwd=cwd,
                )
                while proc.poll() is None:
                    if on_poll:
                        on_poll()
                    if time.perf_counter() - started > timeout_s:
                        stop_tree(proc, grace_s=0)
                        return {
                            "error": f"killed after {timeout_s:g} s (a hang?); see "
                            f"{out / 'bench.log'}",
                            "wall_s": round(time.perf_counter() - started, 2),
                        }
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.5)
            except Stopped as stopped:
                if proc is None:
                    raise
                # (a second Ctrl-C must not cut the stop short: the ranks would stay)
                with ignored_stop_signals():
                    under = stop_tree(proc)
                raise Stopped(
                    stopped.signum,
                    f"ended the run it had started, its launcher and the {under} processes under "
                    f"it (their output: {out / 'bench.log'})",
                ) from None
    wall = round(time.perf_counter() - started, 2)
    hung = []
    # every rank finished its work; the exit guard ended some that hung after
    if proc.returncode == HUNG_AT_EXIT:
        hung = [
            line.strip()
            for line in (out / "bench.log").read_text(encoding="utf-8").splitlines()
            if line.strip().startswith("rank ")
            and ("hung at exit" in line or "stopped by the launcher" in line)
        ]
    # (an exit 3 of anything but `rankwise launch` is a failure like any other)
    if proc.returncode and not hung:
        return {"error": failure_reason(out / "bench.log", proc.returncode), "wall_s": wall}
    if result_file and not result_file.exists():
        return {
            "error": f"it ended without writing {result_file.name}",
            "wall_s": wall,
            "no_result": True,
        }
    text = (
        result_file.read_text(encoding="utf-8")
        if result_file
        else (out / "bench.out").read_text(encoding="utf-8").strip().splitlines()[-1]
    )
    return {**json.loads(text), "wall_s": wall, **({"hung_at_exit": hung} if hung else {})}


def failure_reason(log: Path, returncode: int) -> str:
    """Why a failed run failed, from its log: the failing rank (or an error line, else the last
    line), and the exception a rank raised when the log has one."""
    tail = [line for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    first = next((i for i in range(len(tail) - 1, -1, -1) if "failed first" in tail[i]), None)
    # the launcher's summary: the rank that failed first, and where its script made the call
    if first is not None:
        reason = tail[first].strip()
        where = next(
            (
                line.strip()
                for line in tail[first + 1 : first + 12]
                if line.strip().startswith(("where:", "in your code:"))
            ),
            None,
        )
        return reason[:400] + (f"; {where}" if where else "")
    reason = next(
        (line.strip() for line in reversed(tail) if "error" in line.lower()),
        tail[-1].strip() if tail else f"exit code {returncode}",
    )
    raised = next(
        (match.group(2) for line in reversed(tail) if (match := EXCEPTION.match(line))), None
    )
    if raised and raised not in reason:
        reason = f"{reason}: {raised}"
    return reason[:400]


EXCEPTION = re.compile(r"^(\[rank\d+\]:\s*)?((?:\w+\.)*\w*(?:Error|Exception): .*)$")
"""A traceback's last line (``RuntimeError: ...``), as torchrun's ``[rankN]:`` prefix may carry
it."""


def crashed(result: dict) -> bool:
    """Whether a watched run (:func:`rankwise.tools.watch.runs.watched_run`) failed, rather than
    only ending before its last step."""
    return "error" in result and not result.get("ended_early")
