"""The command line of a command that takes a script: ``rankwise CMD SCRIPT.py [options] [-- SCRIPT
ARGS]``.

Options may come before or after the script; everything after ``--`` is the script's own.  The
command's parser keeps what follows its first positional word in ``rest`` (``argparse.REMAINDER``);
:func:`parse_rest` parses that again with the same options, the script and its arguments.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_rest(parser: argparse.ArgumentParser) -> None:
    """``parser`` keeps the script and everything after it for :func:`parse_rest`."""
    parser.add_argument("rest", nargs=argparse.REMAINDER, metavar="SCRIPT.py [-- SCRIPT ARGS]")
    parser.set_defaults(script_parser=parser)


def parse_rest(
    args: argparse.Namespace, options: Callable[[argparse.ArgumentParser], None]
) -> argparse.Namespace:
    """The options given after SCRIPT (``options`` adds them to a parser), the script, and its
    arguments after ``--``; ``-h`` among the command's own options prints the command's help, and no
    script at all is a usage error."""
    command = args.script_parser
    parser = argparse.ArgumentParser(prog=command.prog, usage=command.usage, add_help=False)
    options(parser)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs="*")
    parser.set_defaults(
        **{
            k: v
            for k, v in vars(args).items()
            if k not in ("rest", "run", "command", "script_parser")
        }
    )
    ours = args.rest[: args.rest.index("--")] if "--" in args.rest else args.rest
    if "-h" in ours or "--help" in ours or not args.rest:
        command.print_help()
        command.exit(0 if args.rest else 2)
    return parser.parse_intermixed_args(args.rest)
