"""The ``fastrebalance`` command line.

Each subcommand is a thin shell over a module that tests call directly: parsing,
printing and exit codes live here, the work lives elsewhere (``demo`` -> ``_demo``).

Exit codes:
    0  the command ran and its checks passed
    1  a check failed (the demo lost records; status: unknown group or topic, or
       commit metadata that claims to be ours but cannot be trusted)
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
from typing import Any

from confluent_kafka import KafkaException

from .. import __version__

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
  1    a check failed (the demo lost records; status: unknown group or topic,
       or commit metadata that claims to be fastrebalance's but cannot be trusted)
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


def _number(
    kind: type[int] | type[float], minimum: float, inclusive: bool = True
) -> Callable[[str], float]:
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


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .demo import DemoSettings

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
    from .demo import DemoSettings, format_results, run_demo

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


# ------------------------------------------------------------------ status
_STATUS_EXAMPLES = """\
examples:
  fastrebalance status --bootstrap-servers localhost:9092 --group orders
  fastrebalance status --bootstrap-servers localhost:9092 --group orders --topic orders --watch
  fastrebalance status --bootstrap-servers kafka:9093 --group orders --json \\
      -X security.protocol=SASL_SSL -X sasl.mechanism=PLAIN \\
      -X sasl.username=ops -X sasl.password=...
"""


def _config_pair(text: str) -> tuple[str, str]:
    """``-X key=value``, kcat's spelling, so that secured clusters need no config file."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _add_status(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "status",
        help="show a group's catch-up: safe offsets, pending backlog ranges, child progress, lag",
        description=_paragraphs(
            "Read a consumer group's committed offsets with their range tokens, the child's "
            "commit log (<group>.catchup) and the log-end offsets, and show per partition: "
            "the safe committed offset (what plain tools see), the primary's position, the "
            "pending backlog ranges with a progress bar each, the child's checkpoint, and the "
            "lag (records not yet processed).",
            "Only committed offsets are read, so this works against a group with no live "
            "member and never disturbs a running one. What it shows as pending is what a "
            "restart of the group would read again.",
            "Kafka keeps only the latest commit of each log: a single snapshot knows a range "
            "from the child's previous checkpoint on; --watch follows each range from when it "
            "started, with a drain rate and an ETA.",
        ),
        epilog=_STATUS_EXAMPLES + "\n" + _EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--bootstrap-servers", "-b", required=True, metavar="B", help="the Kafka cluster"
    )
    p.add_argument("--group", "-g", required=True, metavar="G", help="the application's group.id")
    p.add_argument(
        "--topic",
        "-t",
        action="append",
        metavar="T",
        help="only this topic, every partition of it (repeatable; default: every topic the "
        "group committed offsets for)",
    )
    p.add_argument(
        "--catchup-group",
        metavar="C",
        help="the child's group id, if parallel.rebalance.catchup.group.id was set "
        "(default: G.catchup)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON for machines (with --watch: one JSON document per line)",
    )
    p.add_argument(
        "--watch",
        "-w",
        action="store_true",
        help="refresh until Ctrl-C, tracking each range's progress, rate and ETA",
    )
    p.add_argument(
        "--interval",
        type=_number(float, 0, inclusive=False),
        default=2.0,
        metavar="SECONDS",
        help="seconds between --watch refreshes (default: 2)",
    )
    p.add_argument(
        "--count",
        type=_number(int, 1),
        metavar="N",
        help="with --watch, stop after N refreshes (default: until Ctrl-C)",
    )
    p.add_argument(
        "--timeout",
        type=_number(float, 0, inclusive=False),
        default=10.0,
        metavar="SECONDS",
        help="give up on an unanswered request after this long (default: 10)",
    )
    p.add_argument(
        "-X",
        dest="config",
        action="append",
        type=_config_pair,
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka property for the admin client (repeatable), e.g. security.protocol=SSL",
    )
    p.add_argument(
        "--prometheus",
        type=_number(int, 1),
        metavar="PORT",
        help="serve the group's catch-up metrics for Prometheus on this port (/metrics), "
        "read every --interval seconds, until Ctrl-C (needs prometheus_client)",
    )
    p.set_defaults(func=_cmd_status)


def _serve_status_metrics(reader: Any, port: int, interval: float, count: int | None) -> int:
    """``status --prometheus``: this thread owns the reader and refreshes the snapshot;
    the HTTP server's threads only read the latest one."""
    import time

    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        print("fastrebalance status: --prometheus needs prometheus_client "
              "(pip install 'fastrebalance[prometheus]')", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    from ..metrics import StatusCollector
    from .status import StatusError

    latest: list[Any] = [reader.read()]
    registry = CollectorRegistry()
    registry.register(StatusCollector(lambda: latest[0]))
    start_http_server(port, registry=registry)
    print(f"fastrebalance status: serving metrics on http://0.0.0.0:{port}/metrics", flush=True)
    refreshes = 1
    try:
        while count is None or refreshes < count:
            time.sleep(interval)
            try:
                latest[0] = reader.read()
            except StatusError as exc:  # keep serving the last snapshot
                print(f"fastrebalance status: {exc}", file=sys.stderr, flush=True)
            refreshes += 1
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    import json
    import time

    from .status import (
        JSON_SCHEMA_VERSION,
        ClusterUnreachableError,
        GroupNotFoundError,
        ProgressTracker,
        StatusError,
        StatusReader,
        TopicNotFoundError,
        format_status,
    )

    ascii_only = False
    try:
        "\u2588\u2591".encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        ascii_only = True
    clear = args.watch and not args.json and sys.stdout.isatty()
    tracker = ProgressTracker()

    try:
        reader = StatusReader(
            args.bootstrap_servers,
            args.group,
            topics=args.topic,
            catchup_group=args.catchup_group,
            timeout=args.timeout,
            config=dict(args.config),
        )
    except (KafkaException, ValueError, TypeError) as exc:  # librdkafka refused a -X property
        print(f"fastrebalance status: invalid client configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE

    if args.prometheus is not None:
        return _serve_status_metrics(reader, args.prometheus, args.interval, args.count)

    def snapshot() -> int:
        try:
            status = reader.read()
        except StatusError as exc:
            not_found = isinstance(exc, (GroupNotFoundError, TopicNotFoundError))
            code = EXIT_CHECK_FAILED if not_found else EXIT_ERROR
            if args.json:  # stdout stays parseable for the machine reading it
                kind = {
                    GroupNotFoundError: "group_not_found",
                    TopicNotFoundError: "topic_not_found",
                    ClusterUnreachableError: "cluster_unreachable",
                }.get(type(exc), "error")
                doc = {"schema": JSON_SCHEMA_VERSION, "error": kind, "message": str(exc)}
                print(json.dumps(doc), flush=True)
            print(f"fastrebalance status: {exc}", file=sys.stderr, flush=True)
            return code
        if args.watch:
            status = tracker.update(status)
        if args.json:
            doc = status.to_dict()
            print(json.dumps(doc) if args.watch else json.dumps(doc, indent=2), flush=True)
        else:
            if clear:
                print("\x1b[H\x1b[2J", end="")
            print(format_status(status, ascii_only=ascii_only), flush=True)
        return EXIT_CHECK_FAILED if status.problems else EXIT_OK

    code = snapshot()
    if not args.watch:
        return code
    done = 1
    try:
        while args.count is None or done < args.count:
            time.sleep(args.interval)
            if not args.json and not clear:
                print()
            code = snapshot()
            done += 1
    except KeyboardInterrupt:
        pass  # the normal end of a watch: report how the last refresh went
    return code


# ------------------------------------------------------------------- bench
_BENCH_EXAMPLES = """\
examples:
  fastrebalance bench                                   # everything, ~10 min on 2 cores
  fastrebalance bench --backlogs 10000,100000 --reps 1 --duration 5
  fastrebalance bench --scenario steady --reps 5
  fastrebalance bench --bootstrap-servers localhost:9092 --plot latency.png
"""


def _number_list(
    kind: type[int] | type[float], minimum: float
) -> Callable[[str], tuple[int | float, ...]]:
    """An argparse ``type=`` for ``1,2,3``: each item checked like ``_number``."""
    one = _number(kind, minimum)

    def parse(text: str) -> tuple[int | float, ...]:
        items = [t.strip().replace("_", "") for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list")
        return tuple(one(t) for t in items)

    parse.__name__ = f"list of {kind.__name__}"
    return parse


def _report(args: argparse.Namespace, tables: str, as_json: Callable[[], str]) -> None:
    """A benchmark's tables on stdout, and in the files --markdown and --json name."""
    print()
    print(tables, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(tables)
    if args.json:
        with open(args.json, "w") as f:
            f.write(as_json())


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .bench import BenchSettings

    d = BenchSettings()
    p = commands.add_parser(
        "bench",
        help="benchmark post-crash latency, catch-up speed and overhead against plain "
        "confluent-kafka",
        description=_paragraphs(
            "recovery: a group whose committed offsets lag the log end by B records restarts "
            "while a producer writes fresh timestamped records; each record costs W us of "
            "work. Measured for plain confluent_kafka.Consumer and fastrebalance.Consumer "
            "(enable.parallel.rebalance=True), alternating: time to the first fresh record, "
            "fresh-record latency p50/p99/max, time until the backlog is delivered, "
            "records/s, peak RSS; plus the steady-state p99 (fastrebalance, no backlog).",
            "steady: no backlog; poll() and consume(1000) throughput of raw confluent-kafka "
            "and fastrebalance with the mode off and on.",
            "Every run is its own process. Prints Markdown tables of the medians and ratios, "
            "and writes a latency plot when matplotlib is installed "
            "(pip install 'fastrebalance[bench]'). Runs on an embedded Kafka unless "
            "--bootstrap-servers names a cluster.",
        ),
        epilog=_BENCH_EXAMPLES + "\n" + _EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--backlogs",
        type=_number_list(int, 1),
        default=d.backlogs,
        metavar="B,...",
        help=f"recovery backlog sizes, records (default: {','.join(str(b) for b in d.backlogs)})",
    )
    p.add_argument(
        "--work-us",
        type=_number_list(float, 0),
        default=d.work_us,
        metavar="W,...",
        help=f"work per record, microseconds (default: {','.join(f'{w:g}' for w in d.work_us)})",
    )
    p.add_argument(
        "--reps",
        type=_number(int, 1),
        default=d.reps,
        metavar="N",
        help=f"repetitions of every recovery run; tables show medians (default: {d.reps})",
    )
    p.add_argument(
        "--steady-reps",
        type=_number(int, 1),
        default=d.steady_reps,
        metavar="N",
        help=f"repetitions of every steady-state run (default: {d.steady_reps})",
    )
    p.add_argument(
        "--duration",
        type=_number(float, 0, inclusive=False),
        default=d.duration_s,
        metavar="SECONDS",
        help="fresh-latency window after each restart; each recovery run lasts at least "
        f"this long (default: {d.duration_s:g})",
    )
    p.add_argument(
        "--rate",
        type=_number(float, 0, inclusive=False),
        default=d.rate,
        metavar="R",
        help=f"fresh records per second (default: {d.rate:g})",
    )
    p.add_argument(
        "--partitions",
        type=_number(int, 1),
        default=d.partitions,
        metavar="P",
        help=f"partitions of each benchmark topic (default: {d.partitions})",
    )
    p.add_argument(
        "--throughput-records",
        type=_number(int, 1),
        default=d.throughput_records,
        metavar="N",
        help=f"records each steady-state run reads (default: {d.throughput_records:,})",
    )
    p.add_argument(
        "--poll-timeout",
        type=_number(float, 0),
        default=d.poll_timeout_s,
        metavar="SECONDS",
        help="timeout of each poll()/consume() in the steady-state loops "
        f"(default: {d.poll_timeout_s:g}, as in the README)",
    )
    p.add_argument(
        "--scenario",
        choices=("all", "recovery", "steady", "group"),
        default="all",
        help="which scenario to run (default: all; group: group-wide catch-up, 1-3 member "
        "processes, python -m fastrebalance.tools.groupbench run --help)",
    )
    p.add_argument(
        "--bootstrap-servers",
        metavar="B",
        help="use this Kafka cluster instead of an embedded one; the benchmark topics "
        "and groups are deleted afterwards",
    )
    p.add_argument(
        "--timeout",
        type=_number(float, 0, inclusive=False),
        default=d.run_timeout_s,
        metavar="SECONDS",
        help="give up on a run after this long; undelivered records count as lost "
        f"(default: {d.run_timeout_s:g})",
    )
    p.add_argument(
        "--plot",
        default="fastrebalance-bench.png",
        metavar="PATH",
        help="latency-over-time PNG, if matplotlib is installed (default: %(default)s)",
    )
    p.add_argument("--no-plot", action="store_true", help="do not write the plot")
    p.add_argument("--markdown", metavar="PATH", help="also write the tables to this file")
    p.add_argument("--json", metavar="PATH", help="also write every run's raw measurements")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import BenchSettings, format_markdown, result_json, run_bench, write_plot

    if args.scenario == "group":
        from .groupbench import run_from_args

        return run_from_args(args)

    scenarios = ("steady", "recovery") if args.scenario == "all" else (args.scenario,)
    settings = BenchSettings(
        backlogs=tuple(args.backlogs),
        work_us=tuple(float(w) for w in args.work_us),
        reps=args.reps,
        steady_reps=args.steady_reps,
        duration_s=args.duration,
        rate=args.rate,
        partitions=args.partitions,
        throughput_records=args.throughput_records,
        poll_timeout_s=args.poll_timeout,
        scenarios=scenarios,
        bootstrap_servers=args.bootstrap_servers,
        run_timeout_s=args.timeout,
    )
    # The exact command, every option spelled out, so the tables can be reproduced.
    command = (
        f"fastrebalance bench --scenario {args.scenario}"
        f" --backlogs {','.join(str(b) for b in settings.backlogs)}"
        f" --work-us {','.join(f'{w:g}' for w in settings.work_us)} --reps {settings.reps}"
        f" --steady-reps {settings.steady_reps}"
        f" --duration {settings.duration_s:g} --rate {settings.rate:g}"
        f" --partitions {settings.partitions} --throughput-records {settings.throughput_records}"
        f" --poll-timeout {settings.poll_timeout_s:g}"
    )
    if settings.bootstrap_servers:
        command += f" --bootstrap-servers {settings.bootstrap_servers}"
    print(f"fastrebalance bench: {command}\n", flush=True)
    result = run_bench(settings, out=lambda line: print(line, flush=True))
    _report(args, format_markdown(result, command), lambda: result_json(result))
    if not args.no_plot and "recovery" in scenarios:
        written = write_plot(result, args.plot)
        if written:
            print(f"plot written to {written}")
        else:
            print("no plot: matplotlib is not installed (pip install 'fastrebalance[bench]')")
    return EXIT_OK if result.ok else EXIT_CHECK_FAILED


_SCALE_EXAMPLES = """\
examples:
  fastrebalance bench-scale                             # 1,000 partitions, ~4 min on 2 cores
  fastrebalance bench-scale --partitions 100 --layouts 1 --members 1   # seconds
  fastrebalance bench-scale --bootstrap-servers localhost:9092 --markdown scale.md
"""


def _add_bench_scale(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .scale import ScaleSettings

    d = ScaleSettings()
    p = commands.add_parser(
        "bench-scale",
        help="benchmark a restart at 1,000 partitions (planning, commit size, memory, "
        "requests) against plain confluent-kafka",
        description=_paragraphs(
            "A group restarts over P partitions (one topic, or P/T topics each), with 1 or "
            "N members (one process each), and every partition has a small backlog: with "
            "fastrebalance every partition gets a catch-up range, and the group already "
            "holds a range token on every partition (written by an assign()-only "
            "fastrebalance consumer before the restart). A producer writes fresh records "
            "over every partition throughout.",
            "Measured for plain confluent_kafka.Consumer and fastrebalance.Consumer "
            "(enable.parallel.rebalance=True): join to first fresh record, the plan inside "
            "the rebalance callback, a synchronous commit of a token on every partition "
            "(time, metadata bytes, bytes sent), memory per assigned idle partition (RSS, "
            "and tracemalloc of the library's own structures), close(), and broker requests "
            "by type (librdkafka statistics), to show that nothing is asked per partition.",
            "Exit code 1 if a member sent some request type once per partition or the "
            "token was not stored on every partition; the timing and memory targets are "
            "reported, not enforced. Runs on an embedded Kafka unless --bootstrap-servers "
            "names a cluster.",
        ),
        epilog=_SCALE_EXAMPLES + "\n" + _EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--partitions",
        type=_number(int, 2),
        default=d.partitions,
        metavar="P",
        help=f"partitions of the group in every layout (default: {d.partitions:,})",
    )
    p.add_argument(
        "--layouts",
        type=_number_list(int, 1),
        default=d.layouts,
        metavar="T,...",
        help="topics to spread the partitions over, one run each; must divide P "
        f"(default: {','.join(str(t) for t in d.layouts)})",
    )
    p.add_argument(
        "--members",
        type=_number_list(int, 1),
        default=d.members,
        metavar="N,...",
        help=f"group sizes, one process per member (default: {','.join(map(str, d.members))})",
    )
    p.add_argument(
        "--backlog",
        type=_number(int, 1),
        default=d.backlog,
        metavar="B",
        help="records written to every partition before the crash, and again after it "
        f"(default: {d.backlog})",
    )
    p.add_argument(
        "--threshold",
        type=_number(int, 0),
        default=d.threshold,
        metavar="N",
        help=f"parallel.rebalance.lag.threshold, below B (default: {d.threshold})",
    )
    p.add_argument(
        "--rate",
        type=_number(float, 0, inclusive=False),
        default=d.rate,
        metavar="R",
        help=f"fresh records per second over all partitions (default: {d.rate:g})",
    )
    p.add_argument(
        "--few",
        type=_number(int, 1),
        default=d.few,
        metavar="N",
        help=f"partitions of the memory baseline run (default: {d.few})",
    )
    p.add_argument(
        "--settle",
        type=_number(float, 0),
        default=d.settle_s,
        metavar="SECONDS",
        help="the group counts as settled after this long without an assignment change "
        f"(default: {d.settle_s:g})",
    )
    p.add_argument(
        "--timeout",
        type=_number(float, 0, inclusive=False),
        default=d.run_timeout_s,
        metavar="SECONDS",
        help="give up on a run that has not settled after this long "
        f"(default: {d.run_timeout_s:g})",
    )
    p.add_argument(
        "--bootstrap-servers",
        metavar="B",
        help="use this Kafka cluster instead of an embedded one; the benchmark topics "
        "and groups are deleted afterwards",
    )
    p.add_argument("--markdown", metavar="PATH", help="also write the tables to this file")
    p.add_argument("--json", metavar="PATH", help="also write every run's raw measurements")
    p.set_defaults(func=_cmd_bench_scale)


def _cmd_bench_scale(args: argparse.Namespace) -> int:
    from .scale import ScaleSettings, format_markdown, result_json, run_scale, targets

    try:
        settings = ScaleSettings(
            partitions=args.partitions,
            layouts=tuple(int(t) for t in args.layouts),
            members=tuple(int(m) for m in args.members),
            backlog=args.backlog,
            threshold=args.threshold,
            rate=args.rate,
            few=args.few,
            settle_s=args.settle,
            run_timeout_s=args.timeout,
            bootstrap_servers=args.bootstrap_servers,
        )
    except ValueError as exc:
        print(f"fastrebalance bench-scale: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # The exact command, every option spelled out, so the tables can be reproduced.
    command = (
        f"fastrebalance bench-scale --partitions {settings.partitions}"
        f" --layouts {','.join(map(str, settings.layouts))}"
        f" --members {','.join(map(str, settings.members))} --backlog {settings.backlog}"
        f" --threshold {settings.threshold} --rate {settings.rate:g} --few {settings.few}"
        f" --settle {settings.settle_s:g}"
    )
    if settings.bootstrap_servers:
        command += f" --bootstrap-servers {settings.bootstrap_servers}"
    print(f"fastrebalance bench-scale: {command}\n", flush=True)
    result = run_scale(settings, out=lambda line: print(line, flush=True))
    _report(args, format_markdown(result, command), lambda: result_json(result))
    requests_ok = targets(result)["no per-partition broker requests"][0] is not False
    tokens_ok = all(
        c.seed.tokens == c.partitions for c in result.cells if c.seed is not None
    )
    return EXIT_OK if requests_ok and tokens_ok else EXIT_CHECK_FAILED


_CHAOS_EXAMPLES = """\
examples:
  fastrebalance chaos --duration 3m
  fastrebalance chaos --duration 30m --seed 1234      # replay a run's fault schedule
  fastrebalance chaos --duration 10m --faults kill,kill_commit,stop --protocol consumer
  fastrebalance chaos --duration 5m --cpu-hog 2       # on a loaded machine
  fastrebalance chaos --duration 5m --modes async     # only asynchronous pipelines
  fastrebalance chaos --duration 30m --modes eos -b HOST:PORT   # exactly-once (a real broker)
"""


def _duration(text: str) -> float:
    from ..testing._chaos import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected a positive duration")
    return value


def _fault_list(text: str) -> tuple[str, ...]:
    from ..testing._chaos import ALL_FAULTS

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ALL_FAULTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: faults are a comma-separated list of {', '.join(ALL_FAULTS)}"
        )
    return names


def _mode_list(text: str) -> tuple[str, ...]:
    from ..testing._chaos import ALL_WORKER_MODES

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names or any(n not in ALL_WORKER_MODES for n in names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: modes are a comma-separated list of {', '.join(ALL_WORKER_MODES)}"
        )
    if "eos" in names and len(set(names)) > 1:
        raise argparse.ArgumentTypeError("eos workers run alone: --modes eos")
    return names


def _add_chaos(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..testing._chaos import ALL_FAULTS, WORKER_MODES

    p = commands.add_parser(
        "chaos",
        help="soak test: random crashes, stalls and broker pauses; proves no record is lost",
        description=_paragraphs(
            "Run a producer writing uniquely numbered records and N fastrebalance consumer "
            "processes in one group, each logging what it processed (fsynced before it "
            "commits), each at random an in-order worker or an asynchronous pipeline "
            "(out-of-order processing, late commits), while faults are injected at random "
            "moments from a printed seed: "
            "SIGKILL (at random, while the child is mid-range, while a commit is in flight, "
            "while joining), SIGSTOP/SIGCONT past session.timeout.ms and "
            "max.poll.interval.ms, clean restarts, members added and removed, and the broker "
            "process paused (embedded cluster only).",
            "Then drain and check: every record delivered at least once (records deleted by "
            "retention before anyone read them are counted apart), duplicates counted, and "
            "the group's committed offset, sampled with a plain confluent-kafka consumer, "
            "never ahead of what the consumers had durably processed, and every clean "
            "shutdown within the library's documented time bounds. Prints a summary table "
            "with fresh-record latency percentiles; exit code 1 if a check failed.",
        ),
        epilog=_CHAOS_EXAMPLES + "\n" + _EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--duration",
        type=_duration,
        default=600.0,
        metavar="D",
        help="how long faults are injected, e.g. 90s, 10m, 1h (default: 10m)",
    )
    p.add_argument("--seed", type=int, help="replay the fault schedule of an earlier run")
    p.add_argument(
        "--workers",
        type=_number(int, 1),
        default=3,
        metavar="N",
        help="consumer processes at the start; faults add and remove members within "
        "N-1..N+2 (default: 3)",
    )
    p.add_argument(
        "--partitions", type=_number(int, 1), default=8, metavar="P", help="(default: 8)"
    )
    p.add_argument(
        "--rate",
        type=_number(float, 0, inclusive=False),
        default=500.0,
        metavar="R",
        help="records produced per second (default: 500; the embedded cluster keeps "
        "about 100k small lz4 records per partition, older ones are deleted by retention "
        "and reported apart)",
    )
    p.add_argument(
        "--protocol",
        choices=("classic", "cooperative", "consumer"),
        default="cooperative",
        help="group protocol: classic (eager range), cooperative (cooperative-sticky), "
        "consumer (KIP-848) (default: cooperative)",
    )
    p.add_argument(
        "--threshold",
        type=_number(int, 0),
        default=20,
        metavar="N",
        help="parallel.rebalance.lag.threshold of the consumers (default: 20)",
    )
    p.add_argument(
        "--work-us",
        type=_number(int, 0),
        default=250,
        metavar="W",
        help="simulated processing per record, microseconds (default: 250)",
    )
    p.add_argument(
        "--faults",
        type=_fault_list,
        default=ALL_FAULTS,
        metavar="LIST",
        help="comma-separated faults to inject (default: all): " + ", ".join(ALL_FAULTS),
    )
    p.add_argument(
        "--min-faults",
        type=_number(int, 0),
        default=20,
        metavar="N",
        help="keep injecting past --duration until this many faults (default: 20)",
    )
    p.add_argument(
        "--modes",
        type=_mode_list,
        default=WORKER_MODES,
        metavar="LIST",
        help="worker behaviours, one drawn per process from the seed (default: "
        "inorder,async): inorder (consume, process, fsync, commit), async (held batches "
        "processed out of order, commits made late), eos (alone: read-process-write in "
        "transactions, checked exactly once in the output; needs a broker that stores "
        "transactional offsets, not the embedded one)",
    )
    p.add_argument(
        "--cpu-hog",
        type=_number(int, 0),
        default=0,
        metavar="N",
        help="run N busy processes beside everything, for the whole run: a loaded machine "
        "(default: 0)",
    )
    p.add_argument(
        "--bootstrap-servers",
        metavar="B",
        help="use this Kafka cluster instead of an embedded one (no broker pauses then)",
    )
    p.add_argument(
        "--kafka-home",
        metavar="DIR",
        help="start a real Apache Kafka of the run's own from this distribution (bin/kafka-up, "
        "e.g. ../shared/kafka), which broker_pause and broker_restart then hit",
    )
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="where the consumer logs go (default: a new temporary directory, kept)",
    )
    p.add_argument("--quiet", action="store_true", help="print the summary only, not each fault")
    p.set_defaults(func=_cmd_chaos)


def _cmd_chaos(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from ..testing._chaos import ChaosSettings, format_summary, run_chaos

    settings = ChaosSettings(
        duration_s=args.duration,
        seed=args.seed,
        workers=args.workers,
        min_workers=max(1, args.workers - 1),  # a lone member under fire only measures stalls
        max_workers=args.workers + 2,
        partitions=args.partitions,
        rate=args.rate,
        protocol=args.protocol,
        threshold=args.threshold,
        work_us=args.work_us,
        faults=args.faults,
        min_faults=args.min_faults,
        linger_ms=50,  # fewer, larger batches: the embedded broker keeps 100k per partition
        modes=args.modes,
        cpu_hog=args.cpu_hog,
        bootstrap_servers=args.bootstrap_servers,
        kafka_home=Path(args.kafka_home) if args.kafka_home else None,
        workdir=Path(args.workdir) if args.workdir else None,
    )
    if args.bootstrap_servers and args.kafka_home:
        print("--bootstrap-servers and --kafka-home: choose one", file=sys.stderr)
        return EXIT_USAGE

    def out(line: str) -> None:
        if not args.quiet or line.startswith("chaos:"):
            print(line, flush=True)

    result = run_chaos(settings, out=out)
    # the command that replays this run: the options given, with the seed drawn
    words = ["fastrebalance", "chaos", "--duration", f"{args.duration:g}s"]
    words += ["--seed", str(result.seed)]
    defaults = build_parser().parse_args(["chaos"])
    options = (
        "workers", "partitions", "rate", "protocol", "threshold", "work_us", "min_faults",
        "cpu_hog",
    )  # fmt: skip
    for name in (*options, "bootstrap_servers", "kafka_home"):
        value = getattr(args, name)
        if value != getattr(defaults, name):
            text = f"{value:g}" if isinstance(value, float) else str(value)
            words += ["--" + name.replace("_", "-"), text]
    if args.faults != defaults.faults:
        words += ["--faults", ",".join(args.faults)]
    if args.modes != defaults.modes:
        words += ["--modes", ",".join(args.modes)]
    command = " ".join(shlex.quote(w) for w in words)
    print()
    print(format_summary(result, command), flush=True)
    for problem in result.problems():
        print(f"FAILED: {problem}", file=sys.stderr)
    return EXIT_OK if result.ok else EXIT_CHECK_FAILED


def _add_chaos_spark(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..testing._sparkchaos import KILL_POINTS, TRIGGERS

    def names(allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
        def parse(text: str) -> tuple[str, ...]:
            got = tuple(n.strip() for n in text.split(",") if n.strip())
            if not got or any(n not in allowed for n in got):
                raise argparse.ArgumentTypeError(f"{text!r}: a list of {', '.join(allowed)}")
            return got

        return parse

    p = commands.add_parser(
        "chaos-spark",
        help="crash test of the Spark source: SIGKILL the driver, restart, check the sink",
        description=_paragraphs(
            "For each trigger, run a Structured Streaming query on the fastrebalance source "
            "(driver in its own process) over a topic with live traffic, SIGKILL the driver "
            "at random points (any moment, after the offset log, after the commit log, while "
            "the sink reads, during and after its write), restart it on the same checkpoint "
            "with a backlog built while it was down, then drain and check: every record in "
            "the sink at least once, a replayed batch identical to its first attempt, no "
            "duplicate that no crash explains (docs/reliability.md).",
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration", type=_duration, default=300.0, metavar="D",
                   help="chaos time, shared by the triggers (default: 5m)")  # fmt: skip
    p.add_argument("--seed", type=int, help="replay the kill schedule of an earlier run")
    p.add_argument("--triggers", type=names(TRIGGERS), default=TRIGGERS, metavar="LIST")
    p.add_argument("--points", type=names(KILL_POINTS), default=KILL_POINTS, metavar="LIST",
                   help="kill points (default: all): " + ", ".join(KILL_POINTS))  # fmt: skip
    p.add_argument("--first-points", type=names(KILL_POINTS), default=(), metavar="LIST",
                   help="the first lives' kill points (a reproduction)")  # fmt: skip
    p.add_argument("--min-kills", type=_number(int, 0), default=3, metavar="N",
                   help="per trigger, past --duration if need be (default: 3)")  # fmt: skip
    p.add_argument("--partitions", type=_number(int, 1), default=4, metavar="P")
    p.add_argument("--rate", type=_number(float, 0, inclusive=False), default=200.0,
                   metavar="R", help="live records per second (default: 200)")  # fmt: skip
    p.add_argument("--starting-offsets", choices=("earliest", "latest"), default="earliest")
    p.add_argument("--master", default="local[2]", help="Spark master (default: local[2])")
    p.add_argument("--parallel", action="store_true", help="run the triggers side by side")
    p.add_argument("--option", action="append", default=[], metavar="K=V",
                   help="a source option, over the harness's catch-up defaults")  # fmt: skip
    p.add_argument("--bootstrap-servers", metavar="B", help="(default: an embedded cluster)")
    p.add_argument("--workdir", metavar="DIR", help="(default: a new temporary directory)")
    p.set_defaults(func=_cmd_chaos_spark)


def _cmd_chaos_spark(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from ..testing._sparkchaos import SparkChaosSettings, format_result, run_spark_chaos

    settings = SparkChaosSettings(
        duration_s=args.duration, seed=args.seed, triggers=args.triggers, points=args.points,
        first_points=args.first_points,
        min_kills=args.min_kills, partitions=args.partitions, rate=args.rate,
        starting_offsets=args.starting_offsets, master=args.master, parallel=args.parallel,
        bootstrap_servers=args.bootstrap_servers,
        workdir=Path(args.workdir) if args.workdir else None,
    )  # fmt: skip
    for kv in args.option:
        key, sep, value = kv.partition("=")
        if not sep:
            print(f"--option {kv!r}: expected KEY=VALUE", file=sys.stderr)
            return EXIT_USAGE
        settings.options[key] = value
    result = run_spark_chaos(settings, out=lambda line: print(line, flush=True))
    replay = ["fastrebalance", "chaos-spark", "--seed", str(result.seed)]
    replay += ["--duration", f"{args.duration:g}s", "--min-kills", str(args.min_kills)]
    replay += ["--triggers", ",".join(args.triggers), "--points", ",".join(args.points)]
    if args.first_points:
        replay += ["--first-points", ",".join(args.first_points)]
    replay += ["--partitions", str(args.partitions), "--rate", f"{args.rate:g}"]
    replay += ["--starting-offsets", args.starting_offsets, "--master", args.master]
    replay += ["--parallel"] * args.parallel + [x for kv in args.option for x in ("--option", kv)]
    if args.bootstrap_servers:
        replay += ["--bootstrap-servers", args.bootstrap_servers]
    print()
    print(format_result(result, " ".join(shlex.quote(w) for w in replay)), flush=True)
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
    _add_status(commands)
    _add_bench(commands)
    _add_bench_scale(commands)
    _add_chaos(commands)
    _add_chaos_spark(commands)
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
