"""``rankwise doctor``: its command line."""

from __future__ import annotations

import argparse

from rankwise.tools import doctor
from rankwise.tools.harness import add_node_flags, check_layout


def add_parser(commands) -> None:
    p = commands.add_parser("doctor", help="check this machine (and, with the multi-node flags, the nodes) for a "
                                           "distributed run", description=doctor.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_node_flags(p, timeout_s=60.0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_layout(args, min_ranks=1)
    return doctor.run(args)
