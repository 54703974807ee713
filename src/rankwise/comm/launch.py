"""How ``rankwise comm`` starts its ranks (rankwise's spawn launcher, one or many nodes) and how each joins."""

from __future__ import annotations

import argparse

import torch

BACKENDS = ("auto", "gloo", "nccl")


def add_launch_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=2, help="ranks on this node (default 2)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes in the job; start the same command on each")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this node's index, 0 .. nnodes-1")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1", help="node 0's address")
    p.add_argument("--master-port", "--master_port", type=int, default=None,
                   help="node 0's port (chosen free on one node; required with --nnodes > 1)")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: nccl with CUDA, else gloo")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a rank waits for the others (rendezvous and each operation)")


def resolve_backend(backend: str, nproc_per_node: int = 1) -> str:
    """The backend to use: NCCL needs CUDA, a torch built with it and one GPU per local rank."""
    import torch.distributed as torch_dist

    from rankwise.errors import ConfigError

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = gpus > 0 and torch_dist.is_nccl_available()
    if backend == "auto":
        return "nccl" if nccl and gpus >= nproc_per_node else "gloo"
    if backend == "nccl" and not nccl:
        raise ConfigError("--backend nccl needs CUDA GPUs and a torch built with NCCL; this machine has "
                          + ("no CUDA device" if not gpus else "no NCCL") + " (use gloo)")
    if backend == "nccl" and gpus < nproc_per_node:
        raise ConfigError(f"--backend nccl needs one GPU per rank: --nproc-per-node {nproc_per_node} on "
                          f"{gpus} GPU(s) (NCCL refuses two ranks on one GPU); use fewer ranks or gloo")
    return backend


def check_layout(args: argparse.Namespace) -> None:
    from rankwise.errors import ConfigError

    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise ConfigError("--nproc-per-node and --nnodes must be at least 1")
    if args.nproc_per_node * args.nnodes < 2:
        raise ConfigError("a collective needs at least 2 ranks: use --nproc-per-node 2 (or more nodes)")
    if not 0 <= args.node_rank < args.nnodes:
        raise ConfigError(f"--node-rank {args.node_rank} is outside 0 .. {args.nnodes - 1}")
    if args.nnodes > 1 and args.master_port is None:
        raise ConfigError("--nnodes > 1 needs --master-port (the same on every node)")


def start(worker, worker_args: tuple, args: argparse.Namespace) -> None:
    """Run ``worker(local_rank, *worker_args)`` on this node's ranks; a failed rank raises ``LaunchError``."""
    from rankwise.launch.spawn import spawn

    spawn(worker, args.nproc_per_node, worker_args, nnodes=args.nnodes, node_rank=args.node_rank,
          master_addr=args.master_addr, master_port=args.master_port, rdzv_timeout_s=args.timeout)


def join(local_rank: int, backend: str, timeout_s: float):
    """In a rank: join the job's process group on ``backend``; returns ``(ProcessEnv, device)``."""
    from rankwise.env import ProcessEnv, device_for, init_process_group

    env = ProcessEnv.detect()
    device = device_for(local_rank) if backend == "nccl" else torch.device("cpu")
    init_process_group(env, device, timeout_s)
    return env, device
