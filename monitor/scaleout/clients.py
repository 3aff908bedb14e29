"""Kafka clients of both stages (confluent-kafka, the ``kafka`` extra), built in one place.

confluent-kafka is imported lazily: ``import assaywatch.monitor.scaleout`` works without it
and :func:`require_kafka` says how to get it (``pip install 'assaywatch[kafka]'``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from assaywatch.monitor.scaleout.settings import KafkaSettings

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'assaywatch[kafka]'"


class KafkaUnavailable(RuntimeError):
    """confluent-kafka is missing, or the broker did not answer within the bounded wait."""


def require_kafka() -> Any:
    """The ``confluent_kafka`` module, or :class:`KafkaUnavailable` with the install hint."""
    try:
        import confluent_kafka
    except ImportError:
        raise KafkaUnavailable(f"the Kafka scale-out needs confluent-kafka: {INSTALL_HINT}"
                               ) from None
    return confluent_kafka


#: librdkafka's own log lines go through Python logging (not straight to stderr)
RDKAFKA_LOGGER = logging.getLogger("assaywatch.rdkafka")
_QUIET = logging.getLogger("assaywatch.rdkafka.connect")
_QUIET.setLevel(logging.CRITICAL)


def base_config(s: KafkaSettings) -> dict[str, Any]:
    return {"bootstrap.servers": s.bootstrap, "logger": RDKAFKA_LOGGER, **s.client}


def wait_for_broker(s: KafkaSettings) -> int:
    """Wait until the cluster answers a metadata request; return the number of brokers.
    Raises :class:`KafkaUnavailable` after ``connect_timeout_seconds``."""
    ck = require_kafka()
    from confluent_kafka.admin import AdminClient

    # connection failures while waiting are expected: the summary below says what failed
    admin = AdminClient({**base_config(s), "logger": _QUIET,
                         "socket.connection.setup.timeout.ms": 3000})
    deadline = time.monotonic() + s.connect_timeout_seconds
    last = ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise KafkaUnavailable(f"no Kafka broker answered at {s.bootstrap} within "
                                   f"{s.connect_timeout_seconds:g} s ({last or 'no answer'})")
        try:
            md = admin.list_topics(timeout=min(left, 5.0))
            if md.brokers:
                return len(md.brokers)
        except ck.KafkaException as exc:
            last = str(exc.args[0]) if exc.args else str(exc)
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def ensure_topics(s: KafkaSettings, n_brokers: int, *, spans: bool = False,
                  runs: bool = True, state: bool = False, alarms: bool = False,
                  logs: bool = False) -> None:
    """Create the topics a stage reads or writes when they are missing (existing topics are
    left as they are). The state topic gets the runs topic's partition count, compaction;
    the logs topic the spans topic's (a trace's evaluations sit on its spans' partition
    number)."""
    require_kafka()
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(base_config(s))
    md = admin.list_topics(timeout=10)
    rf = s.replication_factor or min(3, n_brokers)
    runs_parts = s.partitions
    if s.runs_topic in md.topics and md.topics[s.runs_topic].partitions:
        runs_parts = len(md.topics[s.runs_topic].partitions)
    spans_parts = s.partitions
    if s.spans_topic in md.topics and md.topics[s.spans_topic].partitions:
        spans_parts = len(md.topics[s.spans_topic].partitions)
    wanted: list[Any] = []
    common = {"min.insync.replicas": str(min(2, rf))}
    if spans and s.spans_topic not in md.topics:
        wanted.append(NewTopic(s.spans_topic, s.partitions, rf, config=common))
    if logs and s.logs_topic and s.logs_topic not in md.topics:
        wanted.append(NewTopic(s.logs_topic, spans_parts, rf, config=common))
    if runs and s.runs_topic not in md.topics:
        wanted.append(NewTopic(s.runs_topic, runs_parts, rf, config=common))
    if state and s.state_topic not in md.topics:
        wanted.append(NewTopic(s.state_topic, runs_parts, rf,
                               config={**common, "cleanup.policy": "compact",
                                       "min.compaction.lag.ms": "60000"}))
    if alarms and s.alarms_topic and s.alarms_topic not in md.topics:
        wanted.append(NewTopic(s.alarms_topic, 1, rf, config=common))
    if not wanted:
        return
    for topic, fut in admin.create_topics(wanted, operation_timeout=15).items():
        try:
            fut.result()
            logger.info("created topic %s", topic)
        except Exception as exc:  # created by a peer meanwhile
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


def partition_count(s: KafkaSettings, topic: str) -> int:
    require_kafka()
    from confluent_kafka.admin import AdminClient

    md = AdminClient(base_config(s)).list_topics(topic, timeout=10)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return 0
    return len(t.partitions)


def usable(msgs: list[Any], who: str) -> Iterator[Any]:
    """The messages of one ``consume`` that carry a record: an error other than a
    partition's end is logged as ``who``'s, and skipped."""
    ck = require_kafka()
    for m in msgs:
        err = m.error()
        if err is None:
            yield m
        elif err.code() != ck.KafkaError._PARTITION_EOF:
            logger.warning("%s: consume error %s", who, err)
