"""The torchrun launcher, called in-process: ``torch.distributed.run`` does the real work.

rankwise adds three things before delegating: a free master port on a single node when
none is given, the workers' environment (OMP_NUM_THREADS = cores / local processes and a
fixed glibc mmap threshold, unless the user set them; see ``set_worker_environment``),
and a per-rank summary of failures instead of torchrun's long report.
"""

from __future__ import annotations

import socket

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from rankwise.launch.errors import LaunchError
from rankwise.launch.ports import free_port, set_worker_environment


def _flag(argv: list[str], *names: str) -> str | None:
    """Value of a torchrun flag in ``--flag value`` or ``--flag=value`` form (dash or underscore spelling)."""
    spellings = {n for name in names for n in (name, name.replace("-", "_"))}
    for i, arg in enumerate(argv):
        key, _, value = arg.partition("=")
        if key in spellings:
            return value if value else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def torchrun_argv(nproc_per_node: int, entry: list[str], *, nnodes: int = 1, node_rank: int = 0,
                  master_addr: str = "127.0.0.1", master_port: int | None = None, max_restarts: int = 0,
                  rdzv_backend: str | None = None, rdzv_endpoint: str | None = None,
                  rdzv_id: str | None = None) -> list[str]:
    """torchrun's argument list for the given settings.

    ``entry`` is ``[script, args...]`` or ``["-m", module, ...]``.
    """
    argv = [f"--nproc-per-node={nproc_per_node}", f"--nnodes={nnodes}", f"--max-restarts={max_restarts}"]
    if rdzv_backend:
        argv += [f"--rdzv-backend={rdzv_backend}", f"--rdzv-endpoint={rdzv_endpoint or ''}",
                 f"--rdzv-id={rdzv_id or 'rankwise'}"]
    else:
        argv += [f"--node-rank={node_rank}", f"--master-addr={master_addr}"]
        if master_port is not None:
            argv.append(f"--master-port={master_port}")
    return argv + entry


def launch(argv: list[str]) -> None:
    """Run torchrun with ``argv`` (torchrun's own flags, then the script and its arguments)."""
    parser = get_args_parser()
    args = parser.parse_args(argv)
    single_node = str(args.nnodes) in ("1", "1:1")
    if single_node and args.rdzv_endpoint == "" and _flag(argv, "--master-port", "--master_port") is None:
        args.master_port = free_port()
    nproc = args.nproc_per_node
    set_worker_environment(int(nproc) if str(nproc).isdigit() else 1)
    try:
        run(args)
    except ChildFailedError as e:
        failures = []
        for global_rank, failure in sorted(e.failures.items()):
            how = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
            message = failure.message if isinstance(failure.message, str) else failure.message.get("message", "")
            detail = message.strip() if message and message != "<N/A>" else "see the traceback above"
            failures.append(f"rank {global_rank} (local rank {failure.local_rank}, host {socket.gethostname()}, "
                            f"pid {failure.pid}) failed with {how}: {detail}")
        raise LaunchError(failures) from None
