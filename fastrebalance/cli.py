"""The ``fastrebalance`` command line.

Each subcommand is a thin shell over a module that tests call directly: parsing,
printing and exit codes live here, the work lives elsewhere (``demo`` -> ``_demo``).

Exit codes:
    0  the command ran and its checks passed
    1  a check failed (e.g. the demo lost records)
    2  usage error (bad arguments)
    3  the command could not run (Kafka unreachable, a timeout, an unexpected error)
    130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaException

from . import __version__

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "main",
]

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_INTERRUPTED = 130

_EPILOG = """\
exit codes:
  0    the command ran and its checks passed
  1    a check failed (e.g. the demo lost records)
  2    usage error
  3    the command could not run (Kafka unreachable, a timeout, an unexpected error)
  130  interrupted
"""


_DEMO_EXAMPLES = """\
examples:
  fastrebalance demo
  fastrebalance demo --backlog 1000000 --partitions 8 --work-us 5
  fastrebalance demo --bootstrap-servers localhost:9092   # docker compose up -d --wait
"""


def _paragraphs(*texts: str) -> str:
    """Wrapped like argparse would, but with paragraph breaks kept: the raw formatter
    that keeps the epilog's layout would otherwise print one endless line each."""
    return "\n\n".join(textwrap.fill(t, 79) for t in texts)


def _number(kind: type[int] | type[float], minimum: float, inclusive: bool = True) -> Callable:
    """An argparse ``type=`` that rejects out-of-range values with a usage error (exit 2)
    instead of letting them fail deep inside a Kafka client."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if value < minimum or (not inclusive and value == minimum):
            bound = ">=" if inclusive else ">"
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected {bound} {minimum:g}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _add_demo(commands: argparse._SubParsersAction) -> None:
    from ._demo import DemoSettings

    d = DemoSettings()
    p = commands.add_parser(
        "demo",
        help="crash a consumer, then compare a plain restart with a fastrebalance restart",
        description=_paragraphs(
            "Produce a backlog, let a consumer commit at its start and crash, keep a producer "
            "writing fresh timestamped records, then restart the group twice, one after the "
            "other: (a) a plain confluent_kafka.Consumer, (b) fastrebalance.Consumer with "
            "enable.parallel.rebalance=True.",
            "Prints, for each: time to the first fresh record (produced after the restart), "
            "fresh-record latency p50/p99, time until the backlog is delivered, duplicates, "
            "and lost records (exit code 1 if any).",
            "Runs on an embedded Kafka (librdkafka's mock cluster, no Docker needed) unless "
            "--bootstrap-servers names a cluster; the defaults take about 20 s.",
        ),
        epilog=_DEMO_EXAMPLES + "\n" + _EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--backlog",
        type=_number(int, 0),
        default=d.backlog,
        metavar="N",
        help=f"records produced before the restart (default: {d.backlog:,})",
    )
    p.add_argument(
        "--partitions",
        type=_number(int, 1),
        default=d.partitions,
        metavar="P",
        help=f"partitions of the demo topic (default: {d.partitions})",
    )
    p.add_argument(
        "--rate",
        type=_number(float, 0, inclusive=False),
        default=d.rate,
        metavar="R",
        help=f"fresh records per second during the restarts (default: {d.rate:g})",
    )
    p.add_argument(
        "--work-us",
        type=_number(float, 0),
        default=d.work_us,
        metavar="W",
        help=f"simulated processing per record, microseconds (default: {d.work_us:g})",
    )
    p.add_argument(
        "--bootstrap-servers",
        metavar="B",
        help="use this Kafka cluster instead of an embedded one (e.g. localhost:9092); "
        "the demo topic and groups are deleted afterwards",
    )
    p.add_argument(
        "--tail",
        type=_number(float, 0),
        default=d.tail_s,
        metavar="SECONDS",
        help="fresh traffic each restart keeps reading after its backlog is delivered "
        f"(default: {d.tail_s:g})",
    )
    p.add_argument(
        "--timeout",
        type=_number(float, 0, inclusive=False),
        default=d.run_timeout_s,
        metavar="SECONDS",
        help="give up on a restart after this long; undelivered records count as lost "
        f"(default: {d.run_timeout_s:g})",
    )
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import DemoSettings, format_results, run_demo

    settings = DemoSettings(
        backlog=args.backlog,
        partitions=args.partitions,
        rate=args.rate,
        work_us=args.work_us,
        bootstrap_servers=args.bootstrap_servers,
        tail_s=args.tail,
        run_timeout_s=args.timeout,
    )
    print("fastrebalance demo: KIP-333 faster rebalancing after a consumer crash\n", flush=True)
    result = run_demo(settings, out=lambda line: print(line, flush=True))
    print()
    print(format_results(result), flush=True)
    return EXIT_OK if result.ok else EXIT_CHECK_FAILED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastrebalance",
        description=_paragraphs(
            "KIP-333 faster rebalancing for confluent-kafka: after a crash, fresh records flow "
            "at once while a child consumer catches up on the backlog in parallel.",
            "Run 'fastrebalance COMMAND --help' for a command's options.",
        ),
        epilog=_EPILOG,
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
    _add_demo(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
    )
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (KafkaException, RuntimeError, OSError) as exc:
        reason = str(exc) or type(exc).__name__  # TimeoutError() says nothing by itself
        print(f"fastrebalance {args.command}: could not run: {reason}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
