"""The node flags every tool that starts ranks shares (``comm``, ``doctor``), parsed into a
:class:`~rankwise.tools.harness.NodeLayout` here, at the edge."""

from __future__ import annotations

import argparse

from rankwise.tools.harness import BACKENDS, NodeLayout

DEFAULTS = NodeLayout()


def add_node_flags(
    p: argparse.ArgumentParser, *, backend: bool = False, timeout_s: float = 120.0
) -> None:
    """The multi-node flags of every tool (the same command runs on every node)."""
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=int,
        default=DEFAULTS.nproc_per_node,
        help=f"ranks on this node (default {DEFAULTS.nproc_per_node})",
    )
    p.add_argument(
        "--nnodes",
        type=int,
        default=DEFAULTS.nnodes,
        help="nodes in the job; start the same command on each (under srun with one task per node, "
        "the four node flags come from Slurm)",
    )
    p.add_argument(
        "--node-rank",
        "--node_rank",
        type=int,
        default=DEFAULTS.node_rank,
        help="this node's index, 0 .. nnodes-1",
    )
    p.add_argument(
        "--master-addr", "--master_addr", default=DEFAULTS.master_addr, help="node 0's address"
    )
    p.add_argument(
        "--master-port",
        "--master_port",
        type=int,
        default=DEFAULTS.master_port,
        help="node 0's port (chosen free on one node; required with --nnodes > 1)",
    )
    if backend:
        p.add_argument(
            "--backend", choices=BACKENDS, default="auto", help="auto: nccl with CUDA, else gloo"
        )
    p.add_argument(
        "--timeout",
        type=float,
        default=timeout_s,
        help="seconds a rank waits for the others (rendezvous and each operation; default "
        f"{timeout_s:g})",
    )


def node_layout(args: argparse.Namespace) -> NodeLayout:
    """The node flags as a layout (not yet checked:
    :func:`~rankwise.tools.harness.check_layout`)."""
    return NodeLayout(
        args.nproc_per_node,
        args.nnodes,
        args.node_rank,
        args.master_addr,
        args.master_port,
        args.timeout,
    )
