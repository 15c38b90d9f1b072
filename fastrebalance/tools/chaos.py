"""``fastrebalance chaos``, ``chaos-spark`` and ``chaos-group``: the crash harnesses of
``fastrebalance.testing`` (``_chaos``: consumer processes; ``_sparkchaos``: a Spark driver;
``_groupchaos``: members sharing one backlog) behind a command line, and the command that
replays a run (its seed, and every option given).
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from pathlib import Path

from ..testing._chaos import ALL_FAULTS, ALL_WORKER_MODES, WORKER_MODES
from ..testing._sparkchaos import KILL_POINTS, TRIGGERS
from . import _args as a

__all__ = ["add_command"]

_CHAOS_EXAMPLES = """\
examples:
  fastrebalance chaos --duration 3m
  fastrebalance chaos --duration 30m --seed 1234      # replay a run's fault schedule
  fastrebalance chaos --duration 10m --faults kill,kill_commit,stop --protocol consumer
  fastrebalance chaos --duration 5m --cpu-hog 2       # on a loaded machine
  fastrebalance chaos --duration 5m --modes async     # only asynchronous pipelines
  fastrebalance chaos --duration 30m --modes eos -b HOST:PORT   # exactly-once (a real broker)
"""


def add_command(commands: a.Commands) -> None:
    _add_chaos(commands)
    _add_chaos_spark(commands)
    _add_chaos_group(commands)


def _modes(text: str) -> tuple[str, ...]:
    names = a.name_list(ALL_WORKER_MODES)(text)
    if "eos" in names and len(set(names)) > 1:
        raise argparse.ArgumentTypeError("eos workers run alone: --modes eos")
    return names


def _add_chaos(commands: a.Commands) -> None:
    p = a.command(
        commands,
        "chaos",
        "soak test: random crashes, stalls and broker pauses; proves no record is lost",
        (
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
        _CHAOS_EXAMPLES,
    )
    count = a.number(int, 0)
    p.add_argument("--duration", type=a.duration, default=600.0, metavar="D",
                   help="how long faults are injected, e.g. 90s, 10m, 1h (default: 10m)")
    a.seed(p, "replay the fault schedule of an earlier run")
    a.option(p, "--workers", 3, a.number(int, 1), "N", "consumer processes at the start; "
             "faults add and remove members within N-1..N+2 (default: {})")
    a.partitions(p, 8, "(default: {})")
    a.rate(p, 500.0, "records produced per second (default: {}; the embedded cluster keeps "
           "about 100k small lz4 records per partition, older ones are deleted by retention "
           "and reported apart)")
    p.add_argument("--protocol", choices=("classic", "cooperative", "consumer"),
                   default="cooperative", help="group protocol: classic (eager range), "
                   "cooperative (cooperative-sticky), consumer (KIP-848) (default: cooperative)")
    a.threshold(p, 20, "parallel.rebalance.lag.threshold of the consumers (default: {})")
    a.option(p, "--work-us", 250, count, "W",
             "simulated processing per record, microseconds (default: {})")
    p.add_argument("--faults", type=a.name_list(ALL_FAULTS), default=ALL_FAULTS,
                   metavar="LIST", help="comma-separated faults to inject (default: all): "
                   + ", ".join(ALL_FAULTS))  # fmt: skip
    a.option(p, "--min-faults", 20, count, "N",
             "keep injecting past --duration until this many faults (default: {})")
    p.add_argument("--modes", type=_modes, default=WORKER_MODES, metavar="LIST",
                   help="worker behaviours, one drawn per process from the seed (default: "
                   "inorder,async): inorder (consume, process, fsync, commit), async (held "
                   "batches processed out of order, commits made late), eos (alone: "
                   "read-process-write in transactions, checked exactly once in the output; "
                   "needs a broker that stores transactional offsets, not the embedded one)")
    a.option(p, "--cpu-hog", 0, count, "N", "run N busy processes beside everything, for the "
             "whole run: a loaded machine (default: {})")
    a.bootstrap_servers(p, "use this Kafka cluster instead of an embedded one (no broker "
                        "pauses then)")
    p.add_argument("--kafka-home", metavar="DIR", help="start a real Apache Kafka of the "
                   "run's own from this distribution (bin/kafka-up, e.g. ../shared/kafka), "
                   "which broker_pause and broker_restart then hit")  # fmt: skip
    a.workdir(p, "where the consumer logs go (default: a new temporary directory, kept)")
    p.add_argument("--quiet", action="store_true", help="print the summary only, not each fault")
    p.set_defaults(func=functools.partial(_chaos, defaults=p.parse_args([])))


def _chaos(args: argparse.Namespace, defaults: argparse.Namespace) -> int:
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
        return a.EXIT_USAGE

    def out(line: str) -> None:
        if not args.quiet or line.startswith("chaos:"):
            print(line, flush=True)

    result = run_chaos(settings, out=out)
    # the command that replays this run: the options given, with the seed drawn
    options = ("workers", "partitions", "rate", "protocol", "threshold", "work_us",
               "min_faults", "cpu_hog", "bootstrap_servers", "kafka_home", "faults", "modes")
    words = ["fastrebalance", "chaos", "--duration", f"{args.duration:g}s"]
    words += ["--seed", str(result.seed), *a.spelled(args, options, defaults)]
    print()
    print(format_summary(result, " ".join(shlex.quote(w) for w in words)), flush=True)
    for problem in result.problems():
        print(f"FAILED: {problem}", file=sys.stderr)
    return a.EXIT_OK if result.ok else a.EXIT_CHECK_FAILED


def _add_chaos_spark(commands: a.Commands) -> None:
    p = a.command(
        commands,
        "chaos-spark",
        "crash test of the Spark source: SIGKILL the driver, restart, check the sink",
        (
            "For each trigger, run a Structured Streaming query on the fastrebalance source "
            "(driver in its own process) over a topic with live traffic, SIGKILL the driver "
            "at random points (any moment, after the offset log, after the commit log, while "
            "the sink reads, during and after its write), restart it on the same checkpoint "
            "with a backlog built while it was down, then drain and check: every record in "
            "the sink at least once, a replayed batch identical to its first attempt, no "
            "duplicate that no crash explains (docs/reliability.md).",
            "With --event-time the query is a watermarked count per event-time window of "
            "every row, started as a user would (the source's defaults), and the check is per "
            "window: every window Spark closed holds every record of the topic whose timestamp "
            "falls in it. With --event-time-routing too, the count takes the live rows only, "
            "the backlog rows (catchup = true) are routed around it to the same sink, and the "
            "source spreads the backlog over batches (catchup.splitBacklog=true).",
        ),
    )
    points = a.name_list(KILL_POINTS)
    p.add_argument("--duration", type=a.duration, default=300.0, metavar="D",
                   help="chaos time, shared by the triggers (default: 5m)")  # fmt: skip
    a.seed(p, "replay the kill schedule of an earlier run")
    p.add_argument("--triggers", type=a.name_list(TRIGGERS), default=TRIGGERS, metavar="LIST")
    p.add_argument("--points", type=points, default=KILL_POINTS, metavar="LIST",
                   help="kill points (default: all): " + ", ".join(KILL_POINTS))  # fmt: skip
    p.add_argument("--first-points", type=points, default=(), metavar="LIST",
                   help="the first lives' kill points (a reproduction)")  # fmt: skip
    a.option(p, "--min-kills", 3, a.number(int, 0), "N",
             "per trigger, past --duration if need be (default: {})")
    a.partitions(p, 4, None)
    a.rate(p, 200.0, "live records per second (default: {})")
    p.add_argument("--starting-offsets", choices=("earliest", "latest"), default="earliest")
    p.add_argument("--master", default="local[2]", help="Spark master (default: local[2])")
    p.add_argument("--parallel", action="store_true", help="run the triggers side by side")
    p.add_argument("--option", action="append", default=[], metavar="K=V",
                   help="a source option, over the harness's catch-up defaults")  # fmt: skip
    p.add_argument("--event-time", action="store_true",
                   help="a watermarked count per window of every row, the source's defaults; "
                   "checked per window (docs/spark.md, Event time)")
    p.add_argument("--event-time-routing", action="store_true",
                   help="with --event-time: the backlog routed around the count, "
                   "catchup.splitBacklog=true")
    p.add_argument("--window", type=a.duration, metavar="D",
                   help="--event-time's window (default: 2s)")
    p.add_argument("--watermark-delay", type=a.duration, metavar="D",
                   help="--event-time's watermark delay (default: 2s)")  # fmt: skip
    a.bootstrap_servers(p, "(default: an embedded cluster)")
    a.workdir(p, "(default: a new temporary directory)")
    p.set_defaults(func=_chaos_spark)


def _chaos_spark(args: argparse.Namespace) -> int:
    from ..testing._sparkchaos import SparkChaosSettings, format_result, run_spark_chaos

    settings = SparkChaosSettings(
        duration_s=args.duration, seed=args.seed, triggers=args.triggers, points=args.points,
        first_points=args.first_points, min_kills=args.min_kills, partitions=args.partitions,
        rate=args.rate, starting_offsets=args.starting_offsets, master=args.master,
        parallel=args.parallel, bootstrap_servers=args.bootstrap_servers,
        workdir=Path(args.workdir) if args.workdir else None, event_time=args.event_time,
        event_time_routing=args.event_time_routing,
    )  # fmt: skip
    if args.event_time_routing and not args.event_time:
        print("--event-time-routing needs --event-time", file=sys.stderr)
        return a.EXIT_USAGE
    if args.window:
        settings.window_ms = round(args.window * 1000)
    if args.watermark_delay:
        settings.watermark_delay_ms = round(args.watermark_delay * 1000)
    for kv in args.option:
        key, sep, value = kv.partition("=")
        if not sep:
            print(f"--option {kv!r}: expected KEY=VALUE", file=sys.stderr)
            return a.EXIT_USAGE
        settings.options[key] = value
    result = run_spark_chaos(settings, out=lambda line: print(line, flush=True))
    options = ("min_kills", "triggers", "points", "first_points", "partitions", "rate",
               "starting_offsets", "master", "parallel", "option", "event_time",
               "event_time_routing", "window", "watermark_delay", "bootstrap_servers")
    words = ["fastrebalance", "chaos-spark", "--seed", str(result.seed)]
    words += ["--duration", f"{args.duration:g}s", *a.spelled(args, options)]
    print()
    print(format_result(result, " ".join(shlex.quote(w) for w in words)), flush=True)
    return a.EXIT_OK if result.ok else a.EXIT_CHECK_FAILED


def _add_chaos_group(commands: a.Commands) -> None:
    p = a.command(
        commands,
        "chaos-group",
        "crash test of group-wide catch-up: SIGKILL members holding chunks, check the group",
        (
            "Run N member processes with parallel.rebalance.group.catchup=true on one "
            "partition holding a backlog, with fresh records arriving; SIGKILL a member at "
            "random every 2-6 s (owner or helper, holding chunks, mid-chunk, mid-commit) and "
            "restart it; then drain with no faults and check: every produced record "
            "processed, and the group's committed offset, sampled ten times a second with a "
            "plain confluent-kafka consumer, never past a record no member had processed "
            "(docs/reliability.md).",
        ),
    )
    p.add_argument("--duration", type=a.duration, default=300.0, metavar="D",
                   help="how long members are killed, e.g. 90s, 30m (default: 5m)")
    a.seed(p, "replay the kill schedule of an earlier run")
    a.option(p, "--members", 3, a.number(int, 1), "N", "member processes (default: {})")
    a.option(p, "--backlog", 30_000, a.number(int, 1), "N",
             "records pending when the members start (default: {})")
    p.add_argument("--protocol", choices=("classic", "consumer"), default="classic",
                   help="group protocol: classic, or consumer (KIP-848; Apache Kafka 4 or "
                        "the embedded cluster) (default: classic)")
    a.bootstrap_servers(p, "(default: an embedded cluster)")
    a.workdir(p, "where the members' logs go (default: a new temporary directory, kept)")
    p.set_defaults(func=_chaos_group)


def _chaos_group(args: argparse.Namespace) -> int:
    import json
    import random
    import tempfile

    from ..testing._groupchaos import run_group_chaos
    from ._runner import Session

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fastrebalance-chaos-group-"))
    with Session("gchaos", args.bootstrap_servers, out=None) as session:
        report = run_group_chaos(
            session.bootstrap, workdir, seconds=args.duration, members=args.members,
            backlog=args.backlog, seed=seed, create_topic=session.cluster.create_topic,
            log=lambda line: print(line, flush=True), protocol=args.protocol,
            group_timeout=session.cluster.kind != "embedded",
        )  # fmt: skip
    words = ["fastrebalance", "chaos-group", "--duration", f"{args.duration:g}s", "--seed",
             str(seed), *a.spelled(args, ("members", "backlog", "protocol",
                                          "bootstrap_servers"))]  # fmt: skip
    print(json.dumps(report.as_dict()))
    print(f"{'PASS' if report.ok else 'FAIL'}: {report.produced:,} records, {report.kills} "
          f"SIGKILLs, {report.lost} lost, {report.unsafe} unsafe offsets in {report.samples:,} "
          f"samples, {report.duplicates:,} duplicates; logs in {workdir}\n"
          f"replay: {' '.join(shlex.quote(w) for w in words)}", flush=True)  # fmt: skip
    return a.EXIT_OK if report.ok else a.EXIT_CHECK_FAILED
