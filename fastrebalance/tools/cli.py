"""The ``fastrebalance`` command line: the list of commands.

Each command module declares its own options and runs its own command (``add_command``);
parsing, logging, exit codes (``_args.EPILOG``) and errors are ``_args.run``'s.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from . import bench, chaos, demo, scale, spark_bench, spark_offsets, status
from ._args import (
    EPILOG,
    EXIT_CHECK_FAILED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    paragraphs,
    run,
)

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

#: In the order ``fastrebalance --help`` lists them.
COMMANDS = (demo, status, bench, scale, spark_bench, spark_offsets, chaos)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastrebalance",
        description=paragraphs(
            "KIP-333 faster rebalancing for confluent-kafka: after a crash, fresh records flow "
            "at once while a child consumer catches up on the backlog in parallel.",
            "Run 'fastrebalance COMMAND --help' for a command's options.",
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log what the consumers decide (catch-up plans, child consumer starts)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
