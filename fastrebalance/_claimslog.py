"""The claims topic's I/O for group-wide catch-up: create it, append records, read them back.

One topic per group (``<group.id>.catchup.claims`` by default), one partition, so that
every member reads one order of records (``_claims`` interprets them). It is created on
first use with ``message.timestamp.type=LogAppendTime`` (the broker stamps each record,
so the log's time that expires claims is one clock, not each member's) and a retention
of a day: a record deleted by retention only makes its chunk read again (see
``docs/design.md``: a done chunk forgotten is offered and read again, never skipped).

ACLs a member needs on a secured cluster: Create (or an operator creates the topic
beforehand), Describe, Read and Write on the claims topic; Read on the reader's group id
``<claims topic>.reader`` (it never commits; librdkafka needs a group id to fetch).

Thread ownership: the producer, the reader and the AdminClient handles are owned by the
thread that calls the Consumer facade (the user's thread): they are used only from
``poll()``/``consume()``/``commit()``/``close()``, like the primary and child handles.
``close()`` lends them to a helper thread while the owner waits, to bound the wait.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka import Consumer as _RdConsumer
from confluent_kafka.cimpl import NewTopic

from ._child import call_bounded
from ._claims import ClaimRecord, Scope, decode_record, encode_record

__all__ = ["ClaimsLog", "client_config", "permanent"]

log = logging.getLogger("fastrebalance.group")

#: librdkafka properties every client of the user's cluster shares (connection, security,
#: logging); consumer-only ones would make the producer and AdminClient warn or fail.
_SHARED = (
    "bootstrap.servers",
    "metadata.broker.list",
    "security.protocol",
    "sasl.",
    "ssl.",
    "ssl_key",
    "socket.",
    "broker.",
    "api.version",
    "reconnect.",
    "retry.backoff",
    "metadata.",
    "topic.metadata.",
    "client.dns.lookup",
    "client.rack",
    "oauth_cb",
    "logger",
    "log_level",
    "log.",
    "enable.ssl.certificate.verification",
    "enable.sasl.oauthbearer.unsecure.jwt",
    "https.",
    "connections.max.idle.ms",
)
#: A day: long enough that a backlog's chunks outlive any catch-up; a deleted record only
#: makes a chunk be read again.
_RETENTION_MS = 24 * 3600 * 1000
#: What the reader is told when the topic was deleted.
_GONE = (
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
)
#: The CreateTopics request's timeout (the controller's answer takes milliseconds).
_CREATE_REQUEST_S = 2.0
#: Answers that asking again will not change: the topic cannot be used as configured
#: (a name Kafka refuses or that collides with another topic's, no ACL, a policy).
_PERMANENT = frozenset(
    {
        KafkaError.TOPIC_EXCEPTION,  # invalid name, incl. "collides with existing topics"
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_CONFIG,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.INVALID_PARTITIONS,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_DELETION_DISABLED,
        KafkaError.UNSUPPORTED_VERSION,
    }
)


def permanent(exc: BaseException) -> bool:
    """Whether starting the claims log failed for a reason that will not pass by itself."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0].code() in _PERMANENT
    return False


def client_config(conf: Mapping[str, Any], suffix: str) -> dict[str, Any]:
    """The user's connection and security settings for a claims-log client."""
    out = {k: v for k, v in conf.items() if isinstance(k, str) and k.startswith(_SHARED)}
    out["client.id"] = f"{conf.get('client.id') or 'rdkafka'}-{suffix}"
    return out


class ClaimsLog:
    """Appends records to the claims topic and reads every record from its start."""

    def __init__(self, conf: Mapping[str, Any], topic: str, timeout_s: float = 10.0) -> None:
        self.topic = topic
        self._conf = dict(conf)
        #: whose records this member reads and writes: its group, on the cluster the
        #: topic lives on (learnt at ``start()``; nothing is read or sent before)
        self.scope = Scope(str(conf.get("group.id") or ""))
        self._timeout = timeout_s
        self._producer: Producer | None = None
        self._reader: _RdConsumer | None = None
        #: the log end when reading began: once read up to it, the state is current
        self._end_at_start: int | None = None
        self.caught_up = False
        self.position = 0
        self.send_failures = 0
        self.closed = False
        #: the broker says the topic is gone (deleted): ``reopen()`` makes it again
        self.missing = False

    @property
    def started(self) -> bool:
        return self._reader is not None

    def start(self) -> None:
        """Create the topic if missing, then the reader (from the log's start) and the
        producer. Bounded by ``timeout_s``; raises KafkaException when the cluster does not
        answer (the caller retries later)."""
        self._ensure_topic()
        reader = _RdConsumer(
            {
                **client_config(self._conf, "claims-reader"),
                "group.id": f"{self.topic}.reader",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 10,
                "fetch.queue.backoff.ms": 10,
                "error_cb": self._on_error,
            }
        )
        try:
            _, high = reader.get_watermark_offsets(
                TopicPartition(self.topic, 0), timeout=self._timeout
            )
        except KafkaException:
            reader.close()
            raise
        self._end_at_start = high
        self.caught_up = high <= 0
        reader.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        self._reader = reader
        self._producer = Producer(
            {
                **client_config(self._conf, "claims"),
                "enable.idempotence": True,  # one order, no duplicates across retries
                "linger.ms": 1,
                "error_cb": self._on_error,
                # a producer's metadata request for a topic that was deleted had a broker
                # with auto.create.topics.enable=true make it again with its own defaults
                # (4 partitions, CreateTime: claim expiry then ran on the members' clocks)
                "allow.auto.create.topics": False,
            }
        )
        self.missing = False

    def reopen(self) -> None:
        """The topic was deleted under the members: make it again as ``start()`` does
        (1 partition, LogAppendTime, 1 day) and read the new log from its start. What this
        member knows of the old log stays (the owners' ledgers keep every chunk not
        absorbed pending, whatever the log forgot). Raises like ``start()``."""
        log.error(
            "claims topic %s is gone (deleted?): making it again with its own settings; "
            "chunks in flight may be read again", self.topic
        )
        self.close(self._timeout)
        self.closed = False
        self._reader = self._producer = None
        self.position = 0
        self.start()

    def _ensure_topic(self) -> None:
        # imported here, not at import: a restarted process is on its way to its first
        # fresh record, and only group catch-up needs the admin package (~10% of the import)
        from confluent_kafka.admin import AdminClient

        # An AdminClient is a producer-type handle (allow.auto.create.topics defaults to
        # true there): its metadata request for the missing topic had a broker with
        # auto.create.topics.enable=true (Apache Kafka's default) create it with the
        # broker's defaults, CreateTime included, before create_topics() below could.
        admin = AdminClient(
            {**client_config(self._conf, "claims-admin"), "allow.auto.create.topics": False}
        )
        md = admin.list_topics(self.topic, timeout=self._timeout)
        self.scope = Scope(self.scope.group, md.cluster_id or "")
        meta = md.topics.get(self.topic)
        if meta is not None and meta.error is None and meta.partitions:
            # partition 0 is the log, whatever the count: a cluster whose controller never
            # answers CreateTopics (librdkafka's mock) auto-creates it with its default
            return
        new = NewTopic(
            self.topic,
            num_partitions=1,
            replication_factor=-1,  # the broker's default.replication.factor
            config={"message.timestamp.type": "LogAppendTime", "retention.ms": str(_RETENTION_MS)},
        )
        future = admin.create_topics(
            [new],
            operation_timeout=self._timeout,
            # bounds the wait for a controller (below); a broker answers in milliseconds
            request_timeout=min(self._timeout, _CREATE_REQUEST_S),
        )[self.topic]
        try:
            future.result(timeout=self._timeout)
            log.info("claims topic %s created", self.topic)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            if err.code() != KafkaError._TIMED_OUT or "controller" not in err.str():
                raise
            # No controller answers CreateTopics (librdkafka's mock cluster never does):
            # the broker's auto-creation is the only way left; the topic then has the
            # broker's defaults (CreateTime: log time is the members' clocks, see
            # docs/design.md)
            log.warning(
                "claims topic %s: no controller answers CreateTopics (%s): created by the "
                "broker's auto-creation instead, with its defaults", self.topic, err.str()
            )
            AdminClient(client_config(self._conf, "claims-admin")).list_topics(
                self.topic, timeout=self._timeout
            )

    def _on_error(self, err: KafkaError) -> None:
        # served by the handles' poll()/consume() on this thread, like _sent
        if err.code() in _GONE:
            self.missing = True
        log.warning("claims log %s: %s", self.topic, err)

    # -- writing ------------------------------------------------------------------------------
    def send(self, rec: ClaimRecord) -> None:
        """Append a record (asynchronously; ``serve()`` and ``flush()`` deliver)."""
        if self._producer is None or self.closed:
            return
        try:
            self._producer.produce(
                self.topic, encode_record(rec, self.scope), partition=0, on_delivery=self._sent
            )
        except (KafkaException, BufferError) as exc:
            self.send_failures += 1
            log.warning("claims log %s: could not send %s: %s", self.topic, rec.kind, exc)
        self._producer.poll(0)

    def _sent(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            if err.code() in _GONE:
                self.missing = True
            self.send_failures += 1
            log.warning("claims log %s: a record was not written: %s", self.topic, err)

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for what was sent; returns how many are still queued."""
        if self._producer is None:
            return 0
        return int(self._producer.flush(timeout_s))

    # -- reading ------------------------------------------------------------------------------
    def end(self, timeout_s: float) -> int | None:
        """The log's end now (asked of the broker), None if it did not answer in time."""
        if self._reader is None:
            return None
        try:
            _, high = self._reader.get_watermark_offsets(
                TopicPartition(self.topic, 0), timeout=max(timeout_s, 0.1)
            )
        except (KafkaException, RuntimeError) as exc:
            log.warning("claims log %s: its end could not be read: %s", self.topic, exc)
            return None
        return int(high)

    def read(self, num: int = 1000, wait_s: float = 0.0) -> list[tuple[ClaimRecord | None, int]]:
        """The next records, in log order, with their timestamps (ms); waits at most
        ``wait_s`` for the first."""
        if self._producer is not None:
            self._producer.poll(0)
        if self._reader is None:
            return []
        try:
            msgs = self._reader.consume(num, wait_s)
        except (KafkaException, RuntimeError) as exc:
            log.warning("claims log %s: read failed: %s", self.topic, exc)
            return []
        out: list[tuple[ClaimRecord | None, int]] = []
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() in _GONE:
                    self.missing = True
                continue
            offset = m.offset() or 0
            self.position = offset + 1
            out.append((decode_record(m.value(), self.scope), m.timestamp()[1]))
        if not self.caught_up and self._end_at_start is not None:
            self.caught_up = self.position >= self._end_at_start
        return out

    def close(self, timeout_s: float) -> None:
        """Deliver what was sent and close both handles, within ``timeout_s``."""
        if self.closed:
            return
        self.closed = True
        producer, reader = self._producer, self._reader

        def shutdown() -> None:
            if producer is not None:
                producer.flush(max(timeout_s - 1.0, 0.1))
                # closed here, on this bounded thread, not destroyed whenever the garbage
                # collector reaches it: a handle destroyed from a collection inside some
                # later call froze a test worker with the GIL held (librdkafka's main
                # thread spinning, the destroy joining it), minutes after its member closed
                producer.purge()
                producer.close()
            if reader is not None:
                reader.close()

        try:
            call_bounded(shutdown, timeout_s, "claims log close()")
        except (KafkaException, RuntimeError) as exc:
            log.warning("claims log %s: close gave up: %s", self.topic, exc)
