"""What the commands' arguments have in common: value types that turn a bad value into a
usage error, the options several commands take (each declared here once, its help worded
by the command), the exit codes, and how a command joins a parser.

Each command module declares its own options next to the code they drive
(``add_command``); ``cli`` only lists the commands. So a benchmark changes without the
command line being touched, and nothing here imports a command: no import circle.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException

if TYPE_CHECKING:  # generic in the stubs only
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Commands = argparse._SubParsersAction  #: the subparsers each command joins

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_ERROR = 3
EXIT_INTERRUPTED = 130

EPILOG = """\
exit codes:
  0    the command ran and its checks passed
  1    a check failed (the demo lost records; status: unknown group or topic,
       or commit metadata that claims to be fastrebalance's but cannot be trusted)
  2    usage error
  3    the command could not run (Kafka unreachable, a timeout, an unexpected error)
  130  interrupted
"""


def paragraphs(*texts: str) -> str:
    """Wrapped like argparse would, but with paragraph breaks kept: the raw formatter
    that keeps the epilog's layout would otherwise print one endless line each."""
    return "\n\n".join(textwrap.fill(t, 79) for t in texts)


def command(
    commands: Commands, name: str, help: str, description: Sequence[str], examples: str = ""
) -> argparse.ArgumentParser:
    """A subcommand with the house layout: wrapped paragraphs, examples, the exit codes."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=help,
        description=paragraphs(*description),
        epilog=f"{examples}\n{EPILOG}" if examples else EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


# ------------------------------------------------------------------------ value types
def number(
    kind: type[int] | type[float], minimum: float, inclusive: bool = True,
    maximum: float = math.inf,
) -> Callable[[str], float]:  # fmt: skip
    """An argparse ``type=`` that rejects out-of-range values (and nan, inf) with a usage
    error (exit 2) instead of letting them fail deep inside a Kafka client."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected a finite number")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected <= {maximum:g}")
        if value < minimum or (not inclusive and value == minimum):
            bound = ">=" if inclusive else ">"
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected {bound} {minimum:g}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def positive(kind: type[int] | type[float] = float) -> Callable[[str], float]:
    return number(kind, 0, inclusive=False)


def number_list(
    kind: type[int] | type[float], minimum: float
) -> Callable[[str], tuple[int | float, ...]]:
    """An argparse ``type=`` for ``1,2,3``: each item checked like ``number``."""
    one = number(kind, minimum)

    def parse(text: str) -> tuple[int | float, ...]:
        items = [t.strip().replace("_", "") for t in text.split(",")]
        if not all(items):  # "5000,,6000" is a typo, not a list of two
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list")
        return tuple(one(t) for t in items)

    parse.__name__ = f"list of {kind.__name__}"
    return parse


def name_list(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse ``type=`` for a comma-separated choice of ``allowed``."""

    def parse(text: str) -> tuple[str, ...]:
        got = tuple(n.strip() for n in text.split(","))
        if not all(got) or any(n not in allowed for n in got):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected a comma-separated list of {', '.join(allowed)}"
            )
        return got

    return parse


def duration(text: str) -> float:
    """'90', '90s', '10m', '1h30m' -> seconds (soaks are long)."""
    from ..testing._chaos import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected a positive duration")
    return value


#: Where a listener binds when its option names a port alone. Loopback, not every interface:
#: what is served (group names, topic names, offsets, lag) is no secret worth a firewall
#: rule, but nobody should publish it by accident; an operator who means a scraper on
#: another host says so (``0.0.0.0:PORT``, ``[::]:PORT``, or ``:PORT``, the exporters'
#: spelling of every interface). docs/operations.md, "Listeners", says the same.
LOOPBACK = "127.0.0.1"
#: ``:PORT``, as Prometheus exporters (``--web.listen-address=:9100``) spell every interface.
ANY_INTERFACE = "0.0.0.0"


def listen_address(text: str) -> tuple[str, int]:
    """An argparse ``type=`` for ``[HOST:]PORT``: ``9101`` (loopback, ``LOOPBACK`` says
    why), ``127.0.0.1:9101``, ``[::1]:9101``, ``host.example:9101``, ``:9101`` (every
    interface). An IPv6 address needs its brackets: ``::1:9101`` could be read two ways.
    Port 0 is refused: the command prints the URL it serves, and a scraper needs to know it."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host = LOOPBACK
    elif host.startswith("[") and host.endswith("]") and len(host) > 2:
        host = host[1:-1]
        if "[" in host or "]" in host:
            raise argparse.ArgumentTypeError(f"{text!r} is not [HOST:]PORT")
    elif ":" in host or "[" in host or "]" in host:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not [HOST:]PORT (an IPv6 address goes in brackets: [::1]:PORT)"
        )
    elif not host:
        host = ANY_INTERFACE
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not [HOST:]PORT (the port is a number from 1 to 65535)"
        )
    return host, int(port)


def url_host(host: str) -> str:
    """A host as a URL spells it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def config_pair(text: str) -> tuple[str, str]:
    """``-X key=value``, kcat's spelling, so that secured clusters need no config file."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


# -------------------------------------------------------------- options of several commands
def word(value: Any) -> str:
    """A value as a command line spells it: 0.5, 10000,100000, inorder,async."""
    if isinstance(value, (tuple, list)):
        return ",".join(word(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def show(value: Any) -> str:
    """A default as the help texts print it: 200,000 (else as ``word``)."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else word(value)


def option(
    p: argparse.ArgumentParser,
    flag: str,
    default: Any,
    kind: Callable[[str], Any] | None,
    metavar: str | None,
    help: str | None = None,
    **more: Any,
) -> None:
    """One option; ``{}`` in ``help`` becomes the default as ``show`` prints it."""
    text = help.replace("{}", show(default)) if help else help
    if kind is not None:
        more["type"] = kind
    p.add_argument(flag, default=default, metavar=metavar, help=text, **more)


def bootstrap_servers(p: argparse.ArgumentParser, help: str, **more: Any) -> None:
    flags = ("--bootstrap-servers", "-b") if more.get("required") else ("--bootstrap-servers",)
    p.add_argument(*flags, metavar="B", help=help, **more)


def partitions(p: argparse.ArgumentParser, default: int, help: str | None, low: int = 1) -> None:
    option(p, "--partitions", default, number(int, low), "P", help)


def rate(p: argparse.ArgumentParser, default: float, help: str) -> None:
    option(p, "--rate", default, positive(), "R", help)


def timeout(p: argparse.ArgumentParser, default: float, help: str) -> None:
    option(p, "--timeout", default, positive(), "SECONDS", help)


def threshold(p: argparse.ArgumentParser, default: int, help: str) -> None:
    option(p, "--threshold", default, number(int, 0), "N", help)


def seed(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--seed", type=int, help=help)


def workdir(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--workdir", metavar="DIR", help=help)


def report_files(p: argparse.ArgumentParser) -> None:
    p.add_argument("--markdown", metavar="PATH", help="also write the tables to this file")
    p.add_argument("--json", metavar="PATH", help="also write every run's raw measurements")


def write_report(args: argparse.Namespace, tables: str, result: Any) -> None:
    """A benchmark's tables on stdout and in the file --markdown names; ``result`` (a
    dataclass, or a list of them), every raw measurement, in the file --json names."""
    print()
    print(tables, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(tables)
    if args.json:
        raw = [asdict(r) for r in result] if isinstance(result, list) else asdict(result)
        with open(args.json, "w") as f:
            f.write(json.dumps(raw, indent=1, default=str))


def spelled(args: argparse.Namespace, names: Sequence[str], defaults: Any = None) -> list[str]:
    """The words that give each option its value in ``args`` (unset ones left out, and, with
    ``defaults``, those at their default): the command that reproduces a run."""
    words: list[str] = []
    for name in names:
        value, flag = getattr(args, name), "--" + name.replace("_", "-")
        if value is None or value is False or value in ((), [], ""):
            continue
        if defaults is not None and value == getattr(defaults, name):
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, list):  # a repeatable option
            words += [w for v in value for w in (flag, word(v))]
        else:
            words += [flag, word(value)]
    return words


# ------------------------------------------------------------------------------- running
def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse, set up logging, run the command's ``func``; returns the exit code."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
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


def run_alone(add_command: Callable[[Commands], None], name: str) -> int:
    """One command as its own program (``python -m fastrebalance.tools.MODULE``)."""
    parser = argparse.ArgumentParser(prog="fastrebalance")
    add_command(parser.add_subparsers(dest="command", required=True))
    return run(parser, [name, *sys.argv[1:]])
