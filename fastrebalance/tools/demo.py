"""``fastrebalance demo``: a crash, a backlog, and two restarts compared side by side.

KIP-333's own story: a consumer committed at the start of a backlog and crashed, the log
grew, and a producer keeps writing fresh records. The group is restarted twice, one run
after the other so that the timings compare: a plain ``confluent_kafka.Consumer``, which
replays the whole backlog before its first fresh record, then ``fastrebalance.Consumer``,
whose primary starts at the log end while the child reads the backlog. Both start from the
crashed group's offsets, copied into two fresh groups (a restart moves its group's offsets).
The measuring loop is ``fastrebalance bench``'s (``workload.measure_restart``), so that both
measure alike.

``--same-group`` shows what the copied offsets hide: before each restart a member of the
restarted group, a process of its own, is SIGKILLed. It never leaves the group, so the
restarted member gets no partition until the group coordinator gives up on the dead one
(its session timeout), unless the restart removes it first
(``parallel.rebalance.remove.dead.members``, ``_recovery``). Three restarts, each after
its own kill, time everything from the SIGKILL: plain confluent-kafka, fastrebalance with
the removal off, and fastrebalance with it on, whose killed member is a fastrebalance
consumer sharing the restart's state directory, so that the restart finds its dead entry.

The removal cannot be shown on the embedded cluster (librdkafka's mock, checked with
librdkafka 2.16 and kafka-python 3.0.12): kafka-python's admin client cannot bootstrap from
it (the mock answers ApiVersions v3 and v4 with UNSUPPORTED_VERSION in a body that
kafka-python cannot decode, and it closes the connection), the mock has no DescribeGroups,
and the LeaveGroup it does accept (pinned to ApiVersions v2) answers NoError yet leaves
the dead member in the group until its session expires. There the third restart is
skipped, and the table says why.

Thread ownership: the fresh producer's handle belongs to its own thread; every other handle
(the session's probe, the consumers) belongs to the thread that calls ``run_demo()``; the
crashed member's, to its own process.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import TopicPartition

from .._config import DEFAULT_LAG_THRESHOLD, REMOVE_DEAD_KEY, STATE_DIR_KEY
from ..testing import KafkaCluster
from ..testing import _workload as wl
from . import _args as a
from ._runner import FAST, PLAIN, Out, Session, Worker, emit, quiet, ratio, worker_main
from .bench import make_consumer
from .workload import BATCH, SESSION_TIMEOUT_MS, RunResult, format_duration, measure_restart

#: Records the crashed consumer reads past its last commit before it dies.
_READ_BEFORE_CRASH = 1000
#: Printed lines wrap here; a step's details are indented under it.
_WIDTH = 92
_INDENT = "      "
#: Apache Kafka's default session.timeout.ms (since 3.0, KIP-735): how long a same-group
#: restart would wait with the consumers' defaults.
_DEFAULT_SESSION_TIMEOUT_MS = 45_000
#: The crashed member's process: its join, its read, and then nothing until it is killed.
_MEMBER_TIMEOUT_S = 60.0
_WORKER_MODULE = "fastrebalance.tools.demo"
#: --same-group's restarts: the killed member and the restart are of one kind.
_KILLED_PLAIN, _REMOVAL_OFF, _REMOVAL_ON = "plain", "removal-off", "removal-on"
#: Why --same-group shows no "removal on" column on the embedded cluster (module docstring).
EMBEDDED_NO_REMOVAL = (
    "removal on: not measured on the embedded cluster, whose mock broker cannot carry the"
    " admin LeaveGroup that removes a dead member (kafka-python cannot bootstrap from it, and"
    " a LeaveGroup it accepts leaves the member in the group until its session expires). Run"
    " with --bootstrap-servers HOST:PORT against Apache Kafka 2.4 or later to see it"
)


@dataclass(frozen=True)
class DemoSettings:
    """What to run (the options of ``fastrebalance demo``); the defaults finish in about
    20 s on the embedded cluster. ``bootstrap_servers`` None starts an embedded cluster."""

    backlog: int = 200_000
    partitions: int = 4
    rate: float = 100.0
    work_us: float = 20.0
    bootstrap_servers: str | None = None
    tail_s: float = 2.0
    run_timeout_s: float = 120.0
    same_group: bool = False


@dataclass(frozen=True)
class DemoResult:
    """What ``run_demo()`` measured; ``lost`` is what the CLI's exit code checks."""

    settings: DemoSettings
    cluster: str
    #: Records in the log after the backlog was produced, from the watermarks.
    log_backlog: int
    plain: RunResult
    fast: RunResult
    wall_s: float
    notes: tuple[str, ...] = ()
    #: --same-group: ``fast`` ran with the removal off; this one with it on (None: not
    #: run, ``removal_skipped`` says why)
    fast_removal: RunResult | None = None
    removal_skipped: str = ""

    @property
    def lost(self) -> int:
        return sum(r.lost for r in (self.plain, self.fast, self.fast_removal) if r is not None)


def _crash(bootstrap: str, topic: str, group: str, start: list[int], read: int) -> int:
    """``group`` commits ``start`` (checked), a member reads ``read`` records past it and
    dies without committing them: ``close()`` with auto-commit off stands in for the
    crash. Returns the records read uncommitted."""
    wl.set_group_offsets(bootstrap, topic, group, start)
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    consumer = PlainConsumer(conf)
    try:
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in enumerate(start)])
        seen, deadline = 0, time.monotonic() + 30.0
        while seen < read:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the crashing consumer read only {seen} of {read} in 30 s")
            seen += sum(1 for m in consumer.consume(BATCH, 0.1) if m.error() is None)
        return seen
    finally:
        consumer.close()


def _fast_conf(kind: str, state_dir: str) -> dict[str, Any]:
    """The mode's keys of a --same-group fastrebalance consumer, killed or restarted."""
    conf: dict[str, Any] = {"enable.parallel.rebalance": True, STATE_DIR_KEY: state_dir}
    if kind == _REMOVAL_OFF:
        conf[REMOVE_DEAD_KEY] = False
    return conf


def _member(spec: dict[str, Any], commands: queue.Queue[str]) -> dict[str, Any]:
    """The crashed member, in a process of its own so that it can be SIGKILLed: it joins
    the group, reads ``read`` records past the committed offsets without committing them,
    says so, and waits for the kill (or for its parent to go away). A fastrebalance member
    (``spec["consumer"]`` not plain) records its membership in ``spec["state_dir"]``, as
    the application's process would."""
    conf = {"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"],
            "enable.auto.commit": False, "session.timeout.ms": SESSION_TIMEOUT_MS}  # fmt: skip
    kind = spec.get("consumer", _KILLED_PLAIN)
    consumer: Any
    if kind == _KILLED_PLAIN:
        consumer = PlainConsumer(conf)
    else:
        from .._consumer import Consumer as FastConsumer

        consumer = FastConsumer({**conf, **_fast_conf(kind, spec["state_dir"])})
    try:
        consumer.subscribe([spec["topic"]])
        seen, deadline = 0, time.monotonic() + _MEMBER_TIMEOUT_S
        while seen < spec["read"]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the member to crash read only {seen} of {spec['read']}")
            seen += sum(1 for m in consumer.consume(BATCH, 0.1) if m.error() is None)
        emit({"event": "read", "records": seen})
        # librdkafka's own thread heartbeats meanwhile: the group still counts this member
        while commands.get() != "eof":
            pass
    finally:
        consumer.close()
    return {"records": seen}


def _sigkill_member(
    bootstrap: str, topic: str, group: str, read: int, consumer: str = _KILLED_PLAIN,
    state_dir: str = "",
) -> tuple[int, float]:  # fmt: skip
    """A member of ``group`` reads ``read`` records past its committed offsets and is
    SIGKILLed: no commit, no LeaveGroup. Returns the records it read and the
    ``time.monotonic()`` of the kill."""
    spec = {"kind": "member", "bootstrap": bootstrap, "topic": topic, "group": group,
            "read": read, "consumer": consumer, "state_dir": state_dir}  # fmt: skip
    member = Worker(_WORKER_MODULE, spec)
    try:
        records: int = member.wait_for("read", _MEMBER_TIMEOUT_S)["records"]
        killed = time.monotonic()
        member.proc.kill()
        member.proc.wait()
        return records, killed
    finally:
        member.close()


def run_demo(
    settings: DemoSettings | None = None, *, cluster: KafkaCluster | None = None,
    out: Out | None = print,
) -> DemoResult:  # fmt: skip
    """Run the story on ``cluster`` (tests pass theirs; None: the settings' or an embedded
    one), telling it line by line to ``out``. RuntimeError or KafkaException when the
    cluster does not do what the demo needs; a lost record is no error but ``lost``."""
    s = settings or DemoSettings()
    emit = out or quiet

    def say(text: str) -> None:
        emit(textwrap.fill(text, _WIDTH, subsequent_indent=_INDENT, break_on_hyphens=False))

    notes: list[str] = []
    steps = 8 if s.same_group else 7
    with Session("demo", s.bootstrap_servers, cluster, out=None) as session:
        bootstrap = session.bootstrap
        say(f"[1/{steps}] Kafka: the {session.description}")
        topic = session.topic("", s.partitions)
        say(f"[2/{steps}] Created topic {topic} with {s.partitions} partitions")

        t = time.monotonic()
        failures = wl.produce_backlog(bootstrap, topic, s.partitions, s.backlog)
        marks = wl.watermarks(session.probe, topic, s.partitions)
        log_backlog = sum(hi - lo for lo, hi in marks)
        say(f"[3/{steps}] Produced {s.backlog:,} records in {time.monotonic() - t:.1f} s:"
            " the backlog")  # fmt: skip
        if log_backlog < s.backlog - failures:
            notes.append(f"retention kept {log_backlog:,} of {s.backlog:,} backlog records")
        if log_backlog / s.partitions <= DEFAULT_LAG_THRESHOLD:
            notes.append(
                f"~{log_backlog / s.partitions:,.0f} records per partition is within"
                f" parallel.rebalance.lag.threshold ({DEFAULT_LAG_THRESHOLD}): no catch-up,"
                " both consumers replay the backlog alike"
            )

        committed = [lo for lo, _ in marks]
        to_read = min(_READ_BEFORE_CRASH, log_backlog)
        plain_group, fast_group = session.group("plain"), session.group("fast")
        removal_group = session.group("removal")
        removal_skipped = ""
        if s.same_group:
            if session.cluster is not None and session.cluster.kind == "embedded":
                removal_skipped = EMBEDDED_NO_REMOVAL
            groups = [plain_group, fast_group] + ([] if removal_skipped else [removal_group])
            for group in groups:
                wl.set_group_offsets(bootstrap, topic, group, committed)
            say(
                f"[4/{steps}] Groups {', '.join(groups)} committed the start of the"
                f" backlog (offsets {', '.join(map(str, committed))}). Before each restart a"
                f" member of that group, a process of its own, reads {to_read:,} records past"
                " it and is SIGKILLed: it never leaves the group, so a restart into the same"
                " group gets its partitions only once the group gives up on the dead member,"
                f" after session.timeout.ms ({SESSION_TIMEOUT_MS:,} ms here, set short so that"
                f" the demo stays short; the default, {_DEFAULT_SESSION_TIMEOUT_MS:,} ms, would"
                " mean waiting 45 s or more), unless the restart removes the dead member"
                " first. Times count from the SIGKILL"
            )
        else:
            group = session.group("crashed")
            read = _crash(bootstrap, topic, group, committed, to_read)
            say(
                f"[4/7] A consumer in group {group} committed the start of the backlog (offsets"
                f" {', '.join(map(str, committed))}), read {read:,} records past it, then"
                " crashed without committing them"
            )
            for copy in (plain_group, fast_group):
                wl.set_group_offsets(bootstrap, topic, copy, committed)
            say(f"{_INDENT}its offsets copied to {plain_group} and {fast_group} for the restarts")

        fresh = wl.FreshProducer(bootstrap, wl.partition_keys(topic, s.partitions), s.rate)
        fresh.start()
        session.later(fresh.stop)
        say(f"[5/{steps}] A producer keeps writing {s.rate:g} fresh records/s, stamped with"
            " their time")  # fmt: skip
        # --same-group's state directory: the killed members' entries, and the restarts'
        state_dir = tempfile.mkdtemp(prefix="fastrebalance-demo-") if s.same_group else ""
        if state_dir:
            session.later(partial(shutil.rmtree, state_dir, ignore_errors=True))

        def restart(kind: str, group: str) -> RunResult:
            if not s.same_group:
                return measure_restart(
                    partial(make_consumer, kind), bootstrap=bootstrap, topic=topic,
                    group=group, start=committed, probe=session.probe, work_us=s.work_us,
                    tail_s=s.tail_s, run_timeout_s=s.run_timeout_s,
                )  # fmt: skip
            read, killed = _sigkill_member(bootstrap, topic, group, to_read, kind, state_dir)
            crashed_end = sum(hi for _lo, hi in wl.watermarks(session.probe, topic,
                                                              s.partitions))  # fmt: skip
            say(f"{_INDENT}a member of {group} read {read:,} records and was SIGKILLed;"
                " restarting into the same group now")  # fmt: skip
            def make(conf: dict[str, Any]) -> Any:
                if kind == _KILLED_PLAIN:
                    return make_consumer(PLAIN, conf)
                return make_consumer(FAST, {**conf, **_fast_conf(kind, state_dir)})

            r = measure_restart(
                make, bootstrap=bootstrap, topic=topic, group=group, start=committed,
                probe=session.probe, work_us=s.work_us, tail_s=s.tail_s,
                run_timeout_s=s.run_timeout_s, fresh_from_join=True, since=killed,
            )  # fmt: skip
            meanwhile = r.backlog - (crashed_end - sum(committed))
            say(f"{_INDENT}waited {format_duration(r.joined_s)} from the kill for its"
                f" assignment; {meanwhile:,} records produced meanwhile joined the"
                " backlog")  # fmt: skip
            say(_INDENT + _summary(r))
            return r

        say(f"[6/{steps}] Restart (a): plain confluent_kafka.Consumer, {s.work_us:g} us of work"
            " a record")  # fmt: skip
        fast_removal = None
        if not s.same_group:
            plain = restart(PLAIN, plain_group)
            say("[7/7] Restart (b): fastrebalance.Consumer(enable.parallel.rebalance=True),"
                " same work")  # fmt: skip
            fast = restart(FAST, fast_group)
        else:
            plain = restart(_KILLED_PLAIN, plain_group)
            say(f"[7/8] Restart (b): fastrebalance.Consumer, {REMOVE_DEAD_KEY}=false")
            fast = restart(_REMOVAL_OFF, fast_group)
            say(f"[8/8] Restart (c): fastrebalance.Consumer, {REMOVE_DEAD_KEY}=true (the"
                " default): the killed member was a fastrebalance consumer too, and the"
                " restart removes it from the group")  # fmt: skip
            if removal_skipped:
                say(f"{_INDENT}skipped: {removal_skipped}")
            else:
                fast_removal = restart(_REMOVAL_ON, removal_group)

        fresh.stop()
        if fresh.error is not None:
            raise RuntimeError(f"the fresh producer failed: {fresh.error}") from fresh.error
        if failures + fresh.failures:
            notes.append(f"{failures + fresh.failures:,} records failed to produce")
        return DemoResult(
            s, session.description, log_backlog, plain, fast, session.wall_s, tuple(notes),
            fast_removal, removal_skipped,
        )  # fmt: skip


# ----------------------------------------------------------------- printing
def _summary(r: RunResult) -> str:
    first, done = format_duration(r.first_fresh_s), format_duration(r.backlog_done_s)
    return f"first fresh record after {first}; backlog delivered after {done}"


#: The table's rows: a label and the ``RunResult`` field; times (``*_s``) get a ratio,
#: but for joining, which is no race (fastrebalance also prepares its child).
_ROWS = (
    ("backlog at restart (records)", "backlog"),
    ("joined the group after", "joined_s"),
    ("time to first fresh record", "first_fresh_s"),
    ("fresh latency p50", "fresh_p50_s"),
    ("fresh latency p99", "fresh_p99_s"),
    ("backlog fully delivered after", "backlog_done_s"),
    ("fresh records delivered", "fresh_records"),
    ("records checked", "expected"),
    ("duplicates", "duplicates"),
    ("lost", "lost"),
)


def _cells(name: str, plain: Any, fast: Any) -> list[str]:
    if not name.endswith("_s"):
        return [f"{plain:,}", f"{fast:,}", ""]
    cells = [format_duration(plain), format_duration(fast), "-"]
    if name == "joined_s":
        cells[2] = ""
    elif plain and fast:
        cells[2] = ratio(plain / fast)
    return cells


#: --same-group's rows: every time counts from the SIGKILL of the member replaced.
_SAME_GROUP_ROWS = (
    ("kill -> partitions assigned", "joined_s"),
    ("kill -> first fresh record", "first_fresh_s"),
    ("kill -> backlog delivered", "backlog_done_s"),
    ("fresh latency p50", "fresh_p50_s"),
    ("backlog at the assignment (records)", "backlog"),
    ("records checked", "expected"),
    ("duplicates", "duplicates"),
    ("lost", "lost"),
)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join([row[0].ljust(widths[0])]
                  + [row[i].rjust(widths[i]) for i in range(1, len(row))]).rstrip()
        for row in rows
    ]  # fmt: skip
    lines.insert(1, "-" * len(lines[0]))
    return lines


def _format_same_group(result: DemoResult) -> list[str]:
    """--same-group: plain, removal off and removal on side by side, from the kill."""
    runs = (result.plain, result.fast, result.fast_removal)
    rows = [["", "plain", "fastrebalance", "fastrebalance"],
            ["", "confluent-kafka", "removal off", "removal on"]]  # fmt: skip
    for label, name in _SAME_GROUP_ROWS:
        cells = [label]
        for r in runs:
            value = None if r is None else getattr(r, name)
            if r is None:
                cells.append("n/a")
            elif name.endswith("_s"):
                cells.append(format_duration(value))
            else:
                cells.append(f"{value:,}")
        rows.append(cells)
    lines = _table(rows)
    lines.insert(1, lines.pop(2))  # the rule under both header lines
    return lines


def format_results(result: DemoResult) -> str:
    """The side-by-side table, its legend, and the verdict line."""
    p, f, s = result.plain, result.fast, result.settings
    if s.same_group:
        return _format_with_legend(result, _format_same_group(result))
    rows = [["", "plain", "fastrebalance", "plain/fast"]]
    rows += [[label, *_cells(name, getattr(p, name), getattr(f, name))]
             for label, name in _ROWS]  # fmt: skip
    return _format_with_legend(result, _table(rows))


def _format_with_legend(result: DemoResult, lines: list[str]) -> str:
    p, f, s = result.plain, result.fast, result.settings
    if s.same_group:
        legend = [
            "Same group: each restart follows the SIGKILL of a member of its group (a process"
            " of its own, of the same kind), and its times count from that kill. Without the"
            " removal a restart waits for the dead member's session timeout"
            f" (session.timeout.ms={SESSION_TIMEOUT_MS} here; Apache Kafka's default is"
            f" {_DEFAULT_SESSION_TIMEOUT_MS}); with it, the restart removes the dead member"
            " (its lock in the state directory was free) and gets its partitions at once."
            " Records produced before the assignment count as backlog, fresh ones are those"
            " produced after it. The restarts run in the demo's process: a new process would"
            " add its start-up (benchmarks/recovery_time.py measures that too)."
            f" {s.work_us:g} us of work per record, {s.rate:g} fresh records/s,"
            f" {s.partitions} partitions, {result.cluster}.",
            *([f"note: {result.removal_skipped}."] if result.removal_skipped else []),
        ]
    else:
        legend = [
            "Times count from each restart (the consumer's creation); a fresh record was"
            " produced after it, and its latency runs from produce to delivery. plain/fast"
            f" above 1: fastrebalance was that many times faster. {s.work_us:g} us of work per"
            f" record, {s.rate:g} fresh records/s, {s.partitions} partitions,"
            f" {result.cluster}.",
        ]
    legend += [f"note: {n}" for n in result.notes]
    runs = [("plain", p), ("fastrebalance", f)]
    if result.fast_removal is not None:
        runs = [("plain", p), ("removal off", f), ("removal on", result.fast_removal)]
    for name, r in runs:
        if r.errors:
            legend.append(f"note: {name} saw errors: {'; '.join(r.errors)}")
        if r.timed_out:
            legend.append(f"note: {name} timed out after {s.run_timeout_s:g} s")
    verdict = f"lost: {result.lost}" + (
        " (every record from the committed offsets to the log end was delivered at least"
        f" once, in {'every run' if s.same_group else 'both runs'})"
        if result.lost == 0
        else " - CHECK FAILED: records were never delivered"
    )
    for text in ["", *legend, "", verdict]:
        lines.append(textwrap.fill(text, _WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    return "\n".join([*lines, f"demo wall time: {result.wall_s:.1f} s"])


# ------------------------------------------------------------------ the command
def add_command(commands: a.Commands) -> None:
    d = DemoSettings()
    p = a.command(
        commands,
        "demo",
        "crash a consumer, then compare a plain restart with a fastrebalance restart",
        (
            "Produce a backlog, crash a consumer at its start, keep a producer writing fresh "
            "records, and restart the group twice: a plain confluent_kafka.Consumer, then "
            "fastrebalance.Consumer. Prints the time to the first fresh record, fresh-record "
            "latency, the time until the backlog is delivered, duplicates and lost records "
            "(exit code 1 if any). Runs on an embedded Kafka (librdkafka's mock cluster) "
            "unless --bootstrap-servers names one; the defaults take about 20 s.",
        ),
        """\
examples:
  fastrebalance demo
  fastrebalance demo --backlog 1000000 --partitions 8 --work-us 5
  fastrebalance demo --same-group     # SIGKILL, then the wait for the session timeout
  fastrebalance demo --same-group --bootstrap-servers localhost:9092   # and its removal
  fastrebalance demo --bootstrap-servers localhost:9092   # docker compose up -d --wait
""",
    )
    a.option(p, "--backlog", d.backlog, a.number(int, 0), "N",
             "records produced before the restart (default: {})")
    a.partitions(p, d.partitions, "partitions of the demo topic (default: {})")
    a.rate(p, d.rate, "fresh records per second during the restarts (default: {})")
    a.option(p, "--work-us", d.work_us, a.number(float, 0), "W",
             "simulated processing per record, microseconds (default: {})")
    a.bootstrap_servers(p, "use this Kafka cluster instead of an embedded one (e.g. "
                        "localhost:9092); the demo topic and groups are deleted afterwards")
    a.option(p, "--tail", d.tail_s, a.number(float, 0), "SECONDS", "fresh traffic each "
             "restart keeps reading after its backlog is delivered (default: {})")
    a.timeout(p, d.run_timeout_s, "give up on a restart after this long; undelivered records "
              "count as lost (default: {})")
    p.add_argument("--same-group", action="store_true",
                   help="SIGKILL a member of the restarted group itself (a process of its own) "
                   "before each restart into that group, and time from the kill: plain "
                   "confluent-kafka and fastrebalance with the dead-member removal off wait "
                   f"for the dead member's session timeout ({SESSION_TIMEOUT_MS} ms here, 45 s "
                   "by default); with it on (parallel.rebalance.remove.dead.members, the "
                   "default) the restart removes the dead member and gets its partitions at "
                   "once. The removal needs a real broker (--bootstrap-servers): on the "
                   "embedded cluster that column says why it is not shown. Without the option "
                   "the restarts use new groups holding the crashed group's offsets, and join "
                   "at once")  # fmt: skip
    p.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    same = ("backlog", "partitions", "rate", "work_us", "bootstrap_servers", "same_group")
    settings = DemoSettings(**{k: getattr(args, k) for k in same}, tail_s=args.tail,
                            run_timeout_s=args.timeout)  # fmt: skip
    print("fastrebalance demo: KIP-333 faster rebalancing after a consumer crash\n", flush=True)
    result = run_demo(settings, out=lambda line: print(line, flush=True))
    print("\n" + format_results(result), flush=True)
    return a.EXIT_OK if result.lost == 0 else a.EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(worker_main({"member": _member}))
