"""The torchrun launcher, called in-process: ``torch.distributed.run`` does the real work.

rankwise adds three things before delegating: a free master port on a single node when
none is given, the workers' environment (OMP_NUM_THREADS = cores / local processes, unless the
user set it; see ``set_worker_environment``),
and a per-rank summary of failures, root cause first, instead of torchrun's long report.
A SIGTERM / SIGINT to this process reaches the workers through torchrun, which waits for
them to checkpoint (``rankwise.train.preemption``) and exit; it surfaces here as ``Stopped``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from rankwise.compat.torch_elastic import publish_master_address_every_round
from rankwise.errors import HungAtExit, LaunchError, Stopped
from rankwise.launch import exits
from rankwise.launch.config import LaunchConfig
from rankwise.launch.entry import Entry
from rankwise.launch.failures import RankFailure
from rankwise.launch.network import choose_interface, is_this_machine, route_to, wait_for_master
from rankwise.launch.ports import free_port, set_worker_environment
from rankwise.logs import get_logger

log = get_logger(__name__)

DEFAULT_C10D_PORT = 29400
DEFAULT_RDZV_TIMEOUT_S = 600.0
"""torch's defaults: the c10d endpoint's port, and the rendezvous timeouts (static `timeout`, c10d
`join_timeout`)."""


def _flag(argv: list[str], *names: str) -> str | None:
    """Value of a torchrun flag in ``--flag value`` or ``--flag=value`` form (dash or underscore
    spelling)."""
    spellings = {n for name in names for n in (name, name.replace("-", "_"))}
    for i, arg in enumerate(argv):
        key, _, value = arg.partition("=")
        if key in spellings:
            return value if value else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def torchrun_args(config: LaunchConfig, entry: Entry) -> argparse.Namespace:
    """torchrun's own settings (its parser's defaults) with ``config``'s launch settings and
    ``entry``."""
    args = get_args_parser().parse_args(entry.argv())
    args.nproc_per_node = str(config.nproc_per_node)
    args.nnodes = str(config.nnodes)
    args.max_restarts = config.max_restarts
    # how long the nodes wait for each other: static reads `timeout`, c10d `join_timeout`
    if config.multi_node:
        seconds = max(1, round(config.timeout_s))
        args.rdzv_conf = f"timeout={seconds},join_timeout={seconds}"
    if config.rdzv_backend:
        args.rdzv_conf = ",".join(
            filter(None, [args.rdzv_conf, f"last_call_timeout={config.rdzv_last_call_s}"])
        )
        args.rdzv_backend, args.rdzv_endpoint = config.rdzv_backend, config.rdzv_endpoint or ""
        args.rdzv_id = config.rdzv_id or "rankwise"
    else:
        args.node_rank, args.master_addr = config.node_rank, config.master_addr
        if config.master_port is not None:
            args.master_port = config.master_port
    return args


def launch(config: LaunchConfig, entry: Entry) -> None:
    """Run ``entry`` on ``config.nproc_per_node`` workers under torchrun's agent (the launcher
    table's entry)."""
    run_torchrun(torchrun_args(config, entry), port_given=config.master_port is not None)


def launch_command_line(argv: list[str], parser: argparse.ArgumentParser | None = None) -> None:
    """Run torchrun with ``argv`` as typed after ``rankwise launch`` (its own flags, then the script
    and its arguments), parsed by ``parser`` (torchrun's, or one extending it)."""
    args = (parser or get_args_parser()).parse_args(argv)
    own_flags = argv[: len(argv) - len(args.training_script_args) - 1]  # not the script's arguments
    if not args.module and not args.no_python:
        # Each rank runs the script as __main__ and then closes the process group it left open
        # (rankwise.launch.script): a stock script's exit is then as clean as rankwise's own loop's.
        args.training_script_args = [args.training_script, *args.training_script_args]
        args.training_script, args.module = "rankwise.launch.script", True
    run_torchrun(args, port_given=_flag(own_flags, "--master-port", "--master_port") is not None)


def run_torchrun(args: argparse.Namespace, port_given: bool) -> None:
    """torch.distributed.run with rankwise's additions: free port, interface, worker environment,
    failure summary."""
    single_node = str(args.nnodes) in ("1", "1:1")
    if single_node and args.rdzv_endpoint == "" and not port_given:
        args.master_port = free_port()
    if not single_node:
        host, port = _rendezvous_endpoint(args)
        node = f"node {args.node_rank}" if not args.rdzv_endpoint else "this node"
        note = choose_interface(host, node)
        if note:
            log.info(f"rankwise: {note}", stderr=True, every_rank=True)  # each node its own
        # fail naming this node and the address, not after torchrun's long wait
        if not is_this_machine(host):
            wait_for_master(host, port, _rendezvous_timeout(args), node)
        elif args.rdzv_endpoint and "is_host" not in (args.rdzv_conf or ""):
            # torch decides who hosts the c10d store by the machine's hostname; when that resolves
            # to loopback no node recognises the endpoint as its own and every node waits as a
            # client.
            args.rdzv_conf = ",".join(filter(None, [args.rdzv_conf, "is_host=true"]))
        interface = route_to(host)
        if (
            args.rdzv_endpoint
            and not args.local_addr
            and interface
            and not interface.address.startswith("127.")
        ):
            # c10d hands the workers node 0's name (often 'localhost') as MASTER_ADDR unless told
            # its address.
            args.local_addr = interface.address
    if args.rdzv_backend not in ("", "static"):
        # torch caches rank 0's address from a dynamic rendezvous's first round
        publish_master_address_every_round()
    nproc = args.nproc_per_node
    set_worker_environment(int(nproc) if str(nproc).isdigit() else 1)
    _quiet_worker_failure_lines()
    with exits.dump_directory() as dumps:  # where a rank the exit guard ends says where it waited
        try:
            run(args)
        except ChildFailedError as e:
            ended = exits.read_dumps(dumps)
            failures = [
                _rank_failure(rank, failure, ended.get(failure.pid))
                for rank, failure in e.failures.items()
            ]
            # the run completed
            if exits.completed([failure.pid for failure in e.failures.values()], ended):
                raise HungAtExit(failures) from None
            note = ""
            if args.max_restarts:
                note = (
                    f"the worker group was restarted {args.max_restarts} time(s) (--max-restarts "
                    f"{args.max_restarts}) and failed again: restart budget exhausted"
                )
            raise LaunchError.from_ranks(failures, note) from None
        except SignalException as e:
            # torchrun sent the signal on to the workers and gave them time to checkpoint and exit.
            raise Stopped(int(e.sigval)) from None


def _quiet_worker_failure_lines() -> None:
    """Drop torchrun's own line for each failed worker ("failed (exitcode: 1) local_rank: 0 ..."):
    the failure summary says it, with the error, once."""
    elastic = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    if not any(isinstance(f, _WorkerFailureLine) for f in elastic.filters):
        elastic.addFilter(_WorkerFailureLine())


class _WorkerFailureLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed (exitcode")


def _rendezvous_endpoint(args) -> tuple[str, int]:
    """The host and port every node connects to: the c10d endpoint, else the master."""
    if args.rdzv_endpoint:
        host, _, port = args.rdzv_endpoint.rpartition(":")
        return (host, int(port)) if host else (args.rdzv_endpoint, DEFAULT_C10D_PORT)
    return args.master_addr, int(args.master_port)


def _rendezvous_timeout(args) -> float:
    """How long torchrun's rendezvous waits for the other nodes (its `--rdzv-conf`, else torch's
    default)."""
    key = "join_timeout" if args.rdzv_endpoint else "timeout"
    conf = dict(item.split("=", 1) for item in (args.rdzv_conf or "").split(",") if "=" in item)
    return float(conf.get(key, DEFAULT_RDZV_TIMEOUT_S))


def _rank_failure(rank: int, failure, hung: exits.HungRank | None = None) -> RankFailure:
    """torchrun's record of a failed worker (the error file ``@record`` wrote, if any) as a
    RankFailure; ``hung``: what the exit guard left where it ended the rank."""
    how = (
        f"signal {failure.signal_name()}"
        if failure.exitcode < 0
        else f"exit code {failure.exitcode}"
    )
    if hung is not None and hung.since != exits.FAILED:
        return RankFailure(
            rank,
            failure.local_rank,
            failure.pid,
            "the exit guard",
            hung.describe(),
            "",
            socket.gethostname(),
            failure.timestamp,
        )
    message = failure.message
    error, trace = "", ""
    if isinstance(message, dict):
        # "Type: message": its first line names the error (a multi-line message goes on with
        # advice).
        error = (str(message.get("message", "")).strip().splitlines() or [""])[0]
        trace = message.get("extraInfo", {}).get("py_callstack", "")
    elif message and message != "<N/A>" and not message.startswith("To enable traceback"):
        error = message.strip()
    if failure.exitcode == -signal.SIGTERM:  # torchrun's own SIGTERM to the rest of a failed group
        error = "terminated by the launcher after another rank failed"
    if hung is not None:  # it failed, then hung at exit: its error first
        error = (
            f"{error}; then hung at exit, ended after {hung.dump.seconds:g} s"
            if error
            else hung.describe()
        )
    return RankFailure(
        rank,
        failure.local_rank,
        failure.pid,
        how,
        error,
        trace,
        socket.gethostname(),
        failure.timestamp,
    )
