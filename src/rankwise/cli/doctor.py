"""``rankwise doctor``: its command line."""

from __future__ import annotations

import argparse

from rankwise.cli.node_flags import add_node_flags, node_layout
from rankwise.tools import doctor
from rankwise.tools.harness import check_layout


def add_parser(commands) -> None:
    p = commands.add_parser(
        "doctor",
        help="check this machine (and, with the multi-node flags, the nodes) for a distributed run",
        description=doctor.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_node_flags(p, timeout_s=60.0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return doctor.run(check_layout(node_layout(args), min_ranks=1))
