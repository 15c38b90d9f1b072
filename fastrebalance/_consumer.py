"""``Consumer``: a drop-in for ``confluent_kafka.Consumer`` implementing KIP-333.

With ``enable.parallel.rebalance=false`` (the default) every public method hands its
arguments to the primary handle's own method: the same behaviour, at the cost of one
Python frame (docs/benchmarks.md measures it). No bound method is copied onto the
instance: a subclass's override of any method runs, as with confluent-kafka's class.
``poll()`` and ``consume()`` are ``_delivery``'s hot path functions themselves, so that
with the mode on too a call costs that one frame.

With it on, a partition gained with a backlog larger than the threshold is read by two
consumers: the *primary* (the user's group member) jumps to the log end so fresh
records flow at once, and the *child* reads the skipped range ``[committed, log end)``
until it reaches its end. ``poll()``/``consume()`` merge both, fresh first.

This module is the facade: its methods validate and delegate, and it owns the time
bounds of ``close()``. Behind it, one shared state and four parts (docs/design.md has the
map):

* ``_partitions``: what this member reads and what it handed out;
* ``_delivery``: records in (poll/consume, the merge of the two streams);
* ``_committing``: the commit path (claims -> ledgers -> both logs' writes), for plain
  commits, the auto-commit and transactions alike;
* ``_assigning``: partitions gained (planned), lost (retired) or waiting (deferred);
* ``_reporting``: status, metrics, statistics and errors.

Thread ownership: the primary and child librdkafka handles are both owned by the
thread that calls this object's methods, exactly as a ``confluent_kafka.Consumer`` is;
do not share one ``Consumer`` between threads. Rebalance callbacks run inside
``poll()``/``consume()`` on that same thread. ``call_bounded`` lends a handle to a helper
thread only while the owner waits (a synchronous commit, ``close()``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Consumer as _RdConsumer

from . import _arguments as check
from ._assigning import Assignments
from ._child import Child, ChildState, call_bounded
from ._closed import CLOSED
from ._committing import Committer, plain_abort, plain_send_offsets
from ._config import ParallelConfig, child_config, split_config
from ._delivery import Delivery, hot_consume, hot_poll
from ._groupcatchup import GroupCatchup
from ._partitions import Partitions
from ._planner import Planner
from ._reporting import CatchupStatus, CatchupStatuses, Reporter

__all__ = ["CatchupStatus", "Consumer"]

log = logging.getLogger("fastrebalance.consumer")

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

def _socket_timeout_s(conf: dict[str, Any]) -> float:
    try:
        return max(int(conf.get("socket.timeout.ms", 60000)), 10) / 1000.0
    except (TypeError, ValueError):  # librdkafka has already rejected such a value
        return 60.0


class Consumer:
    """A ``confluent_kafka.Consumer`` with KIP-333 faster rebalancing.

    Args:
        config: the confluent-kafka configuration dict, plus our keys
            (``enable.parallel.rebalance``, ``parallel.rebalance.*``; see docs).
        **kwargs: merged into ``config``, as confluent-kafka allows (``logger=``).

    Raises:
        TypeError: ``config`` is not a dict (or there is no config), as confluent-kafka's.
        KafkaException: librdkafka rejected the config, or we did: an unknown
            ``parallel.rebalance.*`` key or an invalid value of ours is ``_INVALID_ARG``,
            as librdkafka's own (naming the key, the value and what is accepted; this one
            is a ``ValueError`` too).
        ValueError: confluent-kafka could not create the consumer (no ``group.id``).

    An instance is not a ``confluent_kafka.Consumer`` (``isinstance`` is False, the mode on
    or off): it holds one, or two, and delegates (docs/api.md says why).
    """

    _reporter: Reporter
    # What an instance reads through before (or without: a subclass whose __init__ does not
    # call ours) __init__: confluent-kafka's "Consumer closed" from every method (_closed).
    _primary: _RdConsumer = CLOSED
    #: poll()/consume() serve from this Delivery (the mode on; see _delivery.hot_poll),
    #: or, when None (the mode off, or closed), hand their arguments to ``_reader``'s own
    _hot: Delivery | None = None
    _reader: Any = CLOSED
    _child: Child | None = None
    _group: GroupCatchup | None = None
    _closed = False
    #: the methods hand their arguments to the primary's own: the mode off, and once
    #: close() closed both handles (confluent-kafka's checks then come first, as there)
    _plain = True
    _settings: ParallelConfig = ParallelConfig(enabled=False)
    #: the primary's fatal error, once poll()/consume()/commit() met it (see _on_fatal)
    _failed: KafkaError | None = None

    def __init__(self, config: dict[str, Any] | None = None, /, **kwargs: Any) -> None:
        conf = check.config_dict(config, kwargs)
        self._settings, primary_conf = split_config(conf)
        self._closed = False
        self._subscribed = False
        self._user_callbacks: tuple[Any, Any, Any] = (None, None, None)
        if not self._settings.enabled:
            # The primary handle: the user's group member. Owner: the user's thread.
            self._primary = self._reader = _RdConsumer(primary_conf)
            self._hot = None  # on the instance: read at every poll(), found first there
            return
        self._plain = False
        child_conf = child_config(primary_conf, self._settings)
        user_stats_cb = primary_conf.get("stats_cb")
        if user_stats_cb is not None:
            # librdkafka calls these from poll(), on the user's thread: our state is safe
            # to read. The user's callback sees one document per interval, the primary's,
            # with the child's inside.
            primary_conf["stats_cb"] = lambda s: user_stats_cb(self._reporter.merge_stats(s))
            child_conf["stats_cb"] = lambda stats: self._reporter.keep_child_stats(stats)
        user_on_commit = primary_conf.get("on_commit")
        primary_conf["on_commit"] = lambda err, tps: self._reporter.on_group_commit(err, tps)
        # librdkafka's own network request timeout bounds our synchronous commits and,
        # twice over, our close(): with a hung broker librdkafka alone would block forever.
        self._commit_timeout_s = _socket_timeout_s(primary_conf)
        # The primary handle: the user's group member. Owner: the user's thread.
        self._primary = _RdConsumer(primary_conf)
        # The child handle, created on the first backlog. Owner: the user's thread.
        self._child = child = Child(
            child_conf,
            # the reporter is made just below: these run only once the child reads
            lambda *deleted: self._reporter.report_deleted(*deleted),
            report=lambda err: self._reporter.report_error(err),
            close_timeout_s=self._commit_timeout_s,
        )
        # Group-wide catch-up (opt-in): its claims-log handles are owned by the user's
        # thread too (see _claimslog); none exists with the key off.
        self._group = group = (
            GroupCatchup(self._settings, primary_conf, child)
            if self._settings.group_catchup
            else None
        )
        self._partitions = partitions = Partitions()
        if group is not None:
            group.assigned_topics = lambda: {key[0] for key in partitions.assigned}
            group.assignment_paused = lambda: all(
                child.is_paused(k) for k in (*partitions.assigned, *partitions.deferred)
            )
        reporter = self._reporter = Reporter(
            partitions,
            child,
            self._settings,
            str(primary_conf.get("client.id", "rdkafka")),
            str(primary_conf.get("group.id", "")),
            conf.get("error_cb"),
            user_on_commit,
        )
        # dead members of this group on this host, removed at subscribe() (imported here:
        # a plain-mode consumer never needs it)
        from ._recovery import Recovery

        self._recovery = reporter.recovery = Recovery.make(self._settings, primary_conf)
        settings = self._settings
        self._planner = planner = Planner(
            self._primary,
            child,
            uncommitted=settings.catch_up_uncommitted and settings.reset_offset == OFFSET_BEGINNING,
        )
        self._delivery = delivery = Delivery(
            self._primary, child, partitions, self._settings, self._between_calls
        )
        self._committer = Committer(
            self._primary,
            child,
            planner,
            partitions,
            delivery,
            reporter,
            self._settings,
            self._commit_timeout_s,
            group,
        )
        self._assignments = Assignments(
            self,
            self._primary,
            child,
            planner,
            partitions,
            delivery,
            self._committer,
            reporter,
            self._settings,
            group,
        )
        reporter.commit_failed = self._committer.commit_failed
        if group is not None:
            group.write_group = self._committer.write_absorbed
            group.read_alone = self._assignments.read_alone
            reporter.group = delivery.group = group
        delivery.on_fatal = self._on_fatal
        self._hot = delivery
        reporter.publish()

    def _between_calls(self, now: float) -> None:
        """What poll()/consume() do off the hot path before each slice."""
        if self._delivery.due:
            self._committer.tick_auto_commit()
        self._reporter.publish_if_due(now)
        self._assignments.plan_deferred_if_due(now)
        if self._group is not None:
            self._committer.rewrite_failed(now)
            self._group.tick(now)

    def _on_fatal(self, err: KafkaError) -> None:
        """The primary failed fatally: librdkafka's instance is unusable (it hands out
        nothing more, its assignment is gone and every commit raises ``_FATAL``). From here
        every call is the primary's own, as on a plain consumer, and the other stream
        stops: the child reads no more and the chunks of the group's backlog held here go
        back to the group. Before, the child went on handing out what it held (adversary
        of issue 45, Kafka 4: 14,000 records in the 30 s after the error; plain, none)."""
        if self._failed is not None:
            return
        self._failed = err
        log.error(
            "the consumer failed fatally (%s): catch-up stopped, nothing more is handed "
            "out or committed; close() it and create a new one",
            err.str(),
        )
        self._plain = True
        self._hot, self._reader = None, self._primary
        self._committer.stop()
        if self._group is not None:
            self._group.stop_helping()
        assert self._child is not None  # the mode on
        self._child.stop_all()

    # -- misc ---------------------------------------------------------------------------------
    def __repr__(self) -> str:
        mode = "parallel" if self._settings.enabled else "plain"
        state = self._child.state if self._child is not None else ChildState.NOT_STARTED
        return f"<fastrebalance.Consumer {mode} child={state.value}>"

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- status and metrics ----------------------------------------------------------------
    def child_consumer_is_alive(self) -> bool:
        """True once the child consumer has started and while it runs (reading a
        backlog or on standby for the next crash); False before any catch-up,
        after close(), and while it restarts after a failure."""
        return self._child is not None and self._child.alive

    childConsumerIsAlive = child_consumer_is_alive

    def catchup_status(self) -> CatchupStatuses:
        """Per assigned (topic, partition) with a backlog: ranges, child progress; and
        ``removed_members``, the dead members of the group removed at subscribe()."""
        if self._child is None:
            return CatchupStatuses()
        return self._reporter.catchup_status()

    def catchup_metrics(self) -> dict[str, Any]:
        """Catch-up counters as plain JSON-ready data (also merged into ``stats_cb``).

        Fresh (primary) record counts are librdkafka's own (``rxmsgs`` in the stats):
        counting them here would put work on the hot path.
        """
        if self._child is None:  # plain mode: nothing to catch up, ever
            return {"version": 1, "child_state": ChildState.NOT_STARTED.value}
        return self._reporter.catchup_metrics()

    def metrics_snapshot(self) -> dict[str, Any]:
        """The catch-up metrics as last published, safe to read from any thread (a
        metrics exporter's): this consumer's thread publishes them at every commit and
        rebalance, and every second while a catch-up runs (``fastrebalance.metrics``)."""
        return self._reporter.published if self._child is not None else {}

    # -- subscription and assignment ---------------------------------------------------------
    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """As confluent-kafka's; callbacks receive this Consumer, not the inner handle."""
        if self._closed or self._primary is CLOSED:  # before the arguments, as there
            raise RuntimeError("Consumer closed")
        check.topic_list(topics)
        check.callback("on_assign", on_assign)
        check.callback("on_revoke", on_revoke)
        check.callback("on_lost", on_lost)
        self._user_callbacks = (on_assign, on_revoke, on_lost)
        if self._child is None or self._failed is not None:
            kwargs = {}
            for name, cb in (
                ("on_assign", on_assign),
                ("on_revoke", on_revoke),
                ("on_lost", on_lost),
            ):
                if cb is not None:
                    kwargs[name] = self._relay(cb)
            self._primary.subscribe(topics, **kwargs)
            return
        a = self._assignments
        a.callbacks = self._user_callbacks
        self._subscribed = True
        if self._group is not None:
            if self._settings.auto_commit:
                # as the revoke of a topic left: what the application got of chunks of a
                # topic it no longer reads is processed, by the auto-commit's contract
                self._committer.commit_helped()
            self._group.subscribed(topics)
        recovery = self._recovery
        on_assign = a.on_assign
        if recovery is not None:
            recovery.before_subscribe()
            on_assign = recovery.wrap(on_assign, self._primary.memberid)
        self._primary.subscribe(
            topics, on_assign=on_assign, on_revoke=a.on_revoke, on_lost=a.on_lost
        )
        if recovery is not None:
            recovery.after_subscribe(self._primary.memberid)

    def _relay(self, cb: RebalanceCallback) -> RebalanceCallback:
        return lambda _handle, partitions: cb(self, partitions)

    def unsubscribe(self) -> None:
        self._primary.unsubscribe()
        if self._group is not None:
            if self._settings.auto_commit:
                # what the application got of its chunks is processed, by the auto-commit's
                # contract, as close() takes it (issue 45: all 7,000 records a helper had
                # been handed were read again by the owner after its unsubscribe())
                self._committer.commit_helped()
            self._group.stop_helping()

    def assign(self, partitions: list[TopicPartition]) -> None:
        """As confluent-kafka's; partitions without an offset get a catch-up plan."""
        if self._plain:
            return self._primary.assign(partitions)
        self._assignments.apply(check.partition_list(partitions), incremental=False)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """As confluent-kafka's; partitions without an offset get a catch-up plan."""
        if self._plain:
            return self._primary.incremental_assign(partitions)
        self._assignments.apply(check.partition_list(partitions), incremental=True)

    def unassign(self) -> None:
        """As confluent-kafka's, with its auto-commit of what was handed out."""
        if self._plain:
            return self._primary.unassign()
        self._assignments.unassign()

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """As confluent-kafka's, with its auto-commit of what was handed out."""
        if self._plain:
            return self._primary.incremental_unassign(partitions)
        self._assignments.incremental_unassign(check.partition_list(partitions))

    def assignment(self) -> list[TopicPartition]:
        return self._primary.assignment()

    # -- reading: one Python frame, the hot path's (_delivery.hot_poll says why) -------------
    poll = hot_poll
    consume = hot_consume

    def _hand(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """poll() or consume() for a wrapper that hands the records on later
        (``fastrebalance.aio``): until ``_received()`` says the application has them, no
        bare commit or auto-commit claims them."""
        call = getattr(self, method)
        if self._child is None:
            return call(*args, **kwargs)
        return self._delivery.hand(call, *args, **kwargs)

    def _received(self, got: Any) -> None:
        """The application has the records ``_hand()`` returned (any thread)."""
        if self._child is not None:
            self._delivery.received(got)

    # -- commits ----------------------------------------------------------------------------------
    def commit(
        self,
        message: Message[Any, Any] | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """Commit processed offsets; each claim follows the stream it came from.

        ``message``: that record and every record its stream delivered before it.
        ``offsets``: an offset just after a record the child handed out commits that
        record as ``message`` would (unless the primary was at that offset: its start);
        any other is a position of the primary's stream, and a lower one than before a
        rewind, honoured. Nothing: everything
        both streams handed out. The user's group always stores the *safe* offset (lowest
        unprocessed) with the rest in a range token; works for partitions that already
        left the assignment too. A synchronous commit returns within ``socket.timeout.ms``.

        Returns:
            For a synchronous commit, the partitions as the group stored them.
        """
        if self._plain:
            primary: Any = self._primary  # the stubs' overloads want literal arguments
            return primary.commit(  # type: ignore[no-any-return]
                message=message, offsets=offsets, asynchronous=asynchronous
            )
        if self._closed:  # confluent-kafka's error, not "nothing to commit"
            raise RuntimeError("Consumer closed")
        check.message_or_offsets(message, offsets, required=False)
        try:
            return self._committer.commit(message, offsets, asynchronous)
        except KafkaException as exc:
            # met here first when poll() took the fatal error on its hot path
            if exc.args[0].code() == KafkaError._FATAL:
                self._on_fatal(exc.args[0])
            raise

    def commit_sync(
        self, message: Message[Any, Any] | None = None, offsets: list[TopicPartition] | None = None
    ) -> list[TopicPartition] | None:
        """KIP-333's commitSync(): commit(..., asynchronous=False)."""
        return self.commit(message=message, offsets=offsets, asynchronous=False)

    def commit_async(
        self, message: Message[Any, Any] | None = None, offsets: list[TopicPartition] | None = None
    ) -> None:
        """KIP-333's commitAsync(): commit(..., asynchronous=True)."""
        self.commit(message=message, offsets=offsets, asynchronous=True)

    commitSync = commit_sync
    commitAsync = commit_async

    def store_offsets(
        self, message: Message[Any, Any] | None = None, offsets: list[TopicPartition] | None = None
    ) -> None:
        """As confluent-kafka's (enable.auto.offset.store=false); claims as commit() does,
        written by the next commit() or auto-commit."""
        if self._plain:
            return self._primary.store_offsets(message=message, offsets=offsets)
        check.message_or_offsets(message, offsets, required=True)
        self._committer.store_offsets(message, offsets)

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1.0
    ) -> list[TopicPartition]:
        """Per partition, the lowest offset not yet processed, from both commit logs:
        the child's progress while a range is pending, the primary's offset after.
        ``timeout`` negative (the default): ``socket.timeout.ms``."""
        if self._plain:
            return self._primary.committed(partitions, timeout)
        return self._committer.committed(check.partition_list(partitions), check.timeout_s(timeout))

    # -- transactions -------------------------------------------------------------------------
    def send_offsets_to_transaction(
        self,
        producer: Any,
        messages: Sequence[Message[Any, Any]] | None = None,
        offsets: list[TopicPartition] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Add what ``messages`` claim (or ``offsets``, or with neither everything handed
        out) to ``producer``'s open transaction, for both commit logs.

        The exactly-once twin of ``commit()``: claims as ``commit()`` would, but the user's
        group (safe offset and token, under this member's generation, which fences a
        zombie) and the catch-up group (the checkpoint of backlog records) are written by
        the producer's transaction, atomically with its output. Nothing is claimed in
        this consumer until :meth:`commit_transaction`. Several producers may have a
        transaction open at once, each on its own partitions.

        ``timeout`` is shared by both producer round trips (each given the full timeout,
        a broker hung through both made the call take twice it). It does not bound
        librdkafka's own wait for a reply: a request in flight keeps the producer's
        socket.timeout.ms, and during broker restarts the call was seen blocked for
        minutes (docs/design.md, "Time bounds").

        Raises:
            KafkaException: what the producer raised (abort the transaction then);
                ``_STATE`` for a partition not assigned to this member (its records
                belong to the new owner now), not planned yet, claimed by another open
                transaction, or without parallel.rebalance.transactional;
                ``OFFSET_METADATA_TOO_LARGE`` when the token would need coalescing, which
                would make processed records pending again (their output written twice).
        """
        if self._child is None:
            plain_send_offsets(self._primary, producer, messages, offsets, timeout)
        else:
            self._committer.send_offsets_to_transaction(producer, messages, offsets, timeout)

    def commit_transaction(self, producer: Any, timeout: float | None = None) -> None:
        """``producer.commit_transaction()``; once it returns, the claims sent with
        :meth:`send_offsets_to_transaction` through that producer are processed for this
        consumer too.

        Raises:
            KafkaException: what the producer raised. Retriable: call again. Abortable:
                call :meth:`abort_transaction`. Either way nothing was claimed here.
        """
        if self._child is None:
            if timeout is None:
                producer.commit_transaction()
            else:
                producer.commit_transaction(timeout)
        else:
            self._committer.commit_transaction(producer, timeout)

    def abort_transaction(
        self,
        producer: Any,
        timeout: float | None = None,
        messages: Sequence[Message[Any, Any]] | None = None,
    ) -> None:
        """``producer.abort_transaction()``, then every record the transaction did not
        commit is delivered again: each partition it held has its primary sought back to
        the first record not committed, and the child re-reads its pending backlog. (With
        confluent-kafka alone, the application seeks to the committed offsets; with two
        streams that would re-read processed backlog records.)

        The partitions it held: those of ``messages`` (the records the aborted transaction
        was processing), else those it sent offsets for, else, if it sent none yet, every
        assigned partition that no other open transaction claims and that no other
        producer's transaction was the last to claim. With one producer that is every
        partition; with several (one per partition, say), pass ``messages`` when a
        transaction can fail before its first send_offsets_to_transaction(): a partition
        sought back while another producer still processes its records would have them
        written twice.

        The transaction is forgotten here even when the producer's abort fails: a producer
        that failed fatally cannot abort, and its transaction will never commit (the broker
        aborts it when it times out, or when the next producer with its transactional.id
        starts); its records are delivered again all the same.
        """
        if self._child is None:
            plain_abort(self._primary, producer, timeout)
        else:
            self._committer.abort_transaction(producer, timeout, messages)

    # -- positions ----------------------------------------------------------------------------
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The primary's position; the child takes no part (KIP-333)."""
        return self._primary.position(partitions)

    def seek(self, partition: TopicPartition) -> None:
        """Seek the primary. The child keeps its ranges: seeking changes what is read,
        not what was processed. A backward seek below where the primary started re-reads
        backlog records (they come twice) and claims them only once re-delivered; a
        forward seek skips fresh records as a plain consumer's does. A partition whose
        commit logs could not be read yet (its catch-up not planned) raises ``_STATE``, as
        confluent-kafka's does while it waits for the committed offset. With group-wide
        catch-up, a seek of a partition this member only helps with, into a chunk it holds,
        gives the chunks from there on back to the group: their records are delivered
        again, here or to another member, and no bare commit claims those it had been
        handed from that offset on until they are."""
        if self._plain:
            return self._primary.seek(partition)
        tp = check.partition(partition)
        key = (tp.topic, tp.partition)
        if (
            self._group is not None
            and key not in self._partitions.assigned
            and key not in self._partitions.deferred
            and self._group.seek_back(key, tp.offset)
        ):
            return
        self._delivery.seek(tp)

    def pause(self, partitions: list[TopicPartition]) -> None:
        if self._plain:
            return self._primary.pause(partitions)
        self._primary.pause(check.partition_list(partitions))
        assert self._child is not None  # the mode on
        keys = [(t.topic, t.partition) for t in partitions]
        self._child.pause(keys)
        if self._group is not None:
            # chunks of a partition this member only helps with go back to the group: a
            # paused helper held 4,501 records of the group's backlog for as long as it lived
            self._group.paused([k for k in keys if k not in self._partitions.assigned])
            # pause(assignment()), the usual back-pressure, an empty one included: no
            # chunk either (a partition paused by name, with none assigned, holds off none)
            if (self._partitions.assigned or not keys) and self._group.assignment_paused():
                self._group.hold_off(True)

    def resume(self, partitions: list[TopicPartition]) -> None:
        # a deferred partition stays paused until it is planned (then resumed, unless
        # the application paused it meanwhile)
        if self._plain:
            return self._primary.resume(partitions)
        check.partition_list(partitions)
        deferred = self._partitions.deferred
        self._primary.resume([t for t in partitions if (t.topic, t.partition) not in deferred])
        assert self._child is not None  # the mode on
        self._child.resume([(t.topic, t.partition) for t in partitions])
        if self._group is not None:
            self._group.hold_off(False)

    # -- the primary's own ----------------------------------------------------------------------
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1.0, cached: bool = False
    ) -> tuple[int, int]:
        return self._primary.get_watermark_offsets(partition, timeout, cached)

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = -1.0
    ) -> list[TopicPartition]:
        return self._primary.offsets_for_times(partitions, timeout=timeout)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self._primary.list_topics(topic, timeout)

    def memberid(self) -> str | None:
        return self._primary.memberid()

    def consumer_group_metadata(self) -> Any:
        return self._primary.consumer_group_metadata()

    def cluster_id(self, timeout: float = -1) -> str | None:
        return self._primary.cluster_id(timeout)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        self._primary.set_sasl_credentials(username, password)
        if self._child is not None and self._child.alive:
            self._child.handle().set_sasl_credentials(username, password)

    # -- close ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Commit (if auto-commit is on), leave the group, close both handles.

        Returns within ``2 * socket.timeout.ms`` plus ``REVOKE_WAIT_S``, even when the
        broker is unreachable (librdkafka's own close() waits for outstanding commits): a
        subscribed member first leaves its assignment here, serving the revoke on this
        thread; the handles are then closed on a helper thread while this one waits, and
        are left to finish there if the broker never answers. With group-wide catch-up, a
        member that read chunks of a partition no member owns then writes their done
        chunks into the group's offset (at most 5 s more), first removing the members of
        this host proven dead if the group still lists them.
        """
        if self._closed:
            return
        if self._child is None:
            self._closed = True
            self._primary.close()
            return
        self._committer.stop()
        child = self._child
        # after a fatal error nothing is committed (the primary refuses it) nor left: the
        # handles are closed, and held chunks given back (bye)
        failed = self._failed is not None
        if self._group is not None and not failed:
            # what the application got of its chunks is committed (done), and the chunks
            # of partitions this member owns that the log says are done leave the group's
            # offset before the partitions leave (see GroupCatchup.settle)
            if self._settings.auto_commit:
                self._committer.commit_helped()
            self._group.settle(min(5.0, self._commit_timeout_s))
        # what the application's rebalance callback raised while leaving: raised last
        error = self._assignments.leave() if self._subscribed and not failed else None
        self._assignments.leaving = True
        if self._group is not None:
            # the chunks still held are given back at once (bye), not after the claim timeout
            self._group.close(min(5.0, self._commit_timeout_s))
        self._closed = self._plain = True
        self._hot, self._reader = None, self._primary

        def shutdown() -> None:
            try:
                if self._settings.auto_commit and not self._subscribed and not failed:
                    self._committer.auto_commit(list(self._partitions.assigned))
                try:
                    self._primary.close()
                except KafkaException:
                    raise
                except Exception as exc:
                    # an error_cb (stats_cb, ...) of the application raised while librdkafka
                    # closed the handle: it is closed all the same (leave() says why not
                    # re-raised); librdkafka's own errors still are
                    log.debug("a callback raised while the consumer closed: %r", exc)
            finally:
                child.close()

        left = False
        try:
            call_bounded(shutdown, 2 * self._commit_timeout_s, "close()")
            left = True
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._TIMED_OUT:
                raise
            # the primary's close() is still under way on that thread, and the child's
            # was to come after it: started now, on its own (left open, it went on
            # connecting to the broker for as long as the process lived)
            child.close(wait=False)
            log.error(
                "close() gave up waiting: %s. Uncommitted progress is not lost: the committed "
                "offsets stay safe and those records will be delivered again.",
                exc.args[0].str(),
            )
        else:
            if self._group is not None and self._group.orphans:
                # out of the group now: done chunks of partitions no member owns (_orphans);
                # members of this host proven dead are removed first if they are all the
                # group still lists (one SIGKILLed while it owned such a partition)
                recovery = self._recovery
                self._group.absorb_orphans(
                    min(5.0, self._commit_timeout_s),
                    recovery.remove_dead_now if recovery is not None else None,
                )
        finally:
            if self._recovery is not None:  # still in the group unless it left: stays dead
                self._recovery.close(left)
        if error is not None:
            raise error
