"""The span record every receiver produces and the pipeline consumes.

Protocol types (protobuf messages, OTLP JSON dicts, Jaeger/Tempo documents) stay at the
receiver edge; the first thing a receiver does is turn them into ``SpanRecord``s.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

#: An OTLP AnyValue after decoding: arrays become tuples, kvlists dicts, bytes stay bytes.
AttrValue = str | bool | int | float | bytes | tuple[object, ...] | dict[str, object] | None

STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2

#: SpanRecord.kind of an evaluation event received as an OTLP log record (outside OTLP's
#: span kinds 0-5).
KIND_EVALUATION = 100
#: The GenAI event name of an evaluation result.
EVALUATION_EVENT = "gen_ai.evaluation.result"
#: ``event`` label of ``IngestCounters.logs_received`` for every log record that is not
#: an evaluation event (accepted and discarded).
LOG_EVENT_OTHER = "other"
#: The log-record attributes an evaluation record keeps: the evaluator, its outcome
#: (score value, label, pass flag), and the stream-identifying keys when the log record
#: carries them. ``gen_ai.evaluation.explanation`` and the body are content: never kept.
EVALUATION_KEYS: frozenset[str] = frozenset({
    "gen_ai.evaluation.name",
    "gen_ai.evaluation.score.value",
    "gen_ai.evaluation.score.label",
    "assaywatch.evaluation.passed",
    "gen_ai.agent.name",
    "gen_ai.agent.version",
    "assaywatch.scenario",
})
#: Of :data:`EVALUATION_KEYS`, those that carry an outcome: an evaluation with none of them
#: is rejected (``evaluation_without_score``).
EVALUATION_OUTCOME_KEYS: tuple[str, ...] = (
    "gen_ai.evaluation.score.value",
    "gen_ai.evaluation.score.label",
    "assaywatch.evaluation.passed",
)


#: Estimated bytes of one queued record before its variable parts: the ``SpanRecord``,
#: its three hex ids and name (object headers; the name's characters are added), two
#: times, an empty attribute dict and event list, and its slot in the batch. Measured
#: with ``tracemalloc`` on CPython 3.11 (tests/monitor/test_queue_bytes.py checks the
#: estimate against it). ``service/pipeline.batch_bytes`` is the estimate.
RECORD_BYTES = 600
#: Per attribute (of a span, an event or a resource): its dict entry and its key's object
#: header (the key's characters are added; the value is ``sys.getsizeof``).
ATTR_BYTES = 90
#: Per event: the ``SpanEvent``, its name, time and attribute dict.
EVENT_BYTES = 250


class SpanBatch(list["SpanRecord"]):
    """A decoded request's records, with the estimate ``batch_bytes`` would compute for
    them (``nbytes``; None when unknown): the compiled decoder (native/) computes it while
    it builds the records, which costs a fraction of walking them again. Not to be
    modified: a changed batch keeps the estimate of the records it was decoded with
    (slicing gives a plain list)."""

    __slots__ = ("nbytes",)

    def __init__(self, records: list[SpanRecord], nbytes: int | None) -> None:
        super().__init__(records)
        self.nbytes = nbytes


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int = 0
    attributes: dict[str, AttrValue] = field(default_factory=dict)


@dataclass(slots=True)
class SpanRecord:
    """One span, dialect-neutral, ids as lowercase hex ("" when absent)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    kind: int = 0
    status_code: int = STATUS_UNSET
    status_message: str = ""
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    #: Resource attributes; spans of one ResourceSpans share the same dict object.
    resource: dict[str, AttrValue] = field(default_factory=dict)
    scope_name: str = ""
    #: The span's ``NormalizedSpan`` when the compiled decoder classified it while decoding
    #: (the common GenAI span, ``normalize.native_classify_context``), else None: the
    #: assembler then calls ``classify``. Derived from the fields above at decode time:
    #: not compared, not written to the write-ahead log, and stale if the record is
    #: changed (records are not changed after decoding).
    norm: Any = field(default=None, compare=False, repr=False)


def evaluation_record(trace_id: str, span_id: str, time_ns: int,
                      attributes: dict[str, AttrValue], resource: dict[str, AttrValue],
                      scope_name: str = "") -> SpanRecord:
    """A ``gen_ai.evaluation.result`` event (an OTLP log record) as a :class:`SpanRecord`.

    ``span_id`` is the id of the EVALUATED span ("" when the event names only its trace:
    it joins by trace); ``parent_span_id`` is "", ``name`` is :data:`EVALUATION_EVENT`,
    ``start_ns == end_ns == time_ns`` and ``kind`` is :data:`KIND_EVALUATION`. Only the
    :data:`EVALUATION_KEYS` of ``attributes`` are kept (a new dict); ``resource`` is
    shared as given.
    """
    kept = {k: v for k, v in attributes.items() if k in EVALUATION_KEYS}
    return SpanRecord(trace_id, span_id, "", EVALUATION_EVENT, time_ns, time_ns,
                      KIND_EVALUATION, STATUS_UNSET, "", kept, [], resource, scope_name)


class SpanSink(Protocol):
    """Where receivers deliver decoded spans (and evaluation records, ``kind ==
    KIND_EVALUATION``, decoded from OTLP logs: the same sink, queue and limits).

    ``offer`` returns False when the pipeline is full: the receiver then answers
    429 / UNAVAILABLE with a retry hint and the exporter retries later. It never raises
    for bad spans: the pipeline counts and drops what it cannot use.
    """

    def offer(self, spans: list[SpanRecord], receiver: str) -> bool: ...


def sink_capacity(sink: object) -> int | None:
    """Most spans ``sink`` can ever hold at once, when it says (an int attribute or
    property ``capacity_spans``; None otherwise).

    A request with more spans than this can never be accepted, so the receivers answer it
    413 / RESOURCE_EXHAUSTED (not retried) instead of 503 / UNAVAILABLE forever.
    """
    cap = getattr(sink, "capacity_spans", None)
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None


#: Reason counted for a request refused before it was decoded, the pipeline being known
#: full (``sink_accepting``): one per request, its spans never decoded (its body read and
#: dropped at most).
PIPELINE_FULL_UNREAD = "pipeline_full_unread"


def sink_refusal_reason(sink: object) -> str:
    """Why ``sink`` refused the calling thread's last offer (``refusal_reason()`` when the
    sink says, e.g. ``pipeline_full_bytes``), else ``pipeline_full``."""
    why = getattr(sink, "refusal_reason", None)
    return str(why()) if callable(why) else "pipeline_full"


def sink_accepting(sink: object) -> bool:
    """False while ``sink`` knows it is full (``accepting()``): a receiver then refuses a
    request before reading and decoding it, which costs a fraction of decoding it only
    to see it refused. True for sinks that do not say."""
    ok = getattr(sink, "accepting", None)
    return bool(ok()) if callable(ok) else True


class IngestCounters:
    """Thread-safe counters behind ``assaywatch_spans_received_total`` and
    ``assaywatch_spans_rejected_total`` (and the other "every limit has a counter" ones).

    ``received[receiver]`` counts spans accepted into the pipeline;
    ``rejected[(receiver, reason)]`` counts spans (or requests, when no span could be
    decoded: reason says which) refused at the edge; ``dropped[reason]`` counts what the
    pipeline discarded later (late spans, evicted traces, stream limit, ...);
    ``sanitised[(receiver, reason)]`` counts values the edge repaired and kept (invalid
    UTF-8, names and label values cut, span times; ``receivers/otlp/bounds.py``).

    OTLP logs have counters of their own (evaluation records never count in ``received``):
    ``logs_received[(receiver, event)]`` counts log records accepted, ``event`` being
    :data:`EVALUATION_EVENT` (evaluation records the pipeline took) or ``"other"`` (any
    other log record: answered with success and discarded);
    ``logs_rejected[(receiver, reason)]`` counts log records (or whole logs requests,
    when none could be decoded: reason says which) refused at the edge, including
    ``pipeline_full`` (the sink refused the request's evaluation records: 503 /
    UNAVAILABLE, retried by the exporter).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.received: Counter[str] = Counter()
        self.rejected: Counter[tuple[str, str]] = Counter()
        self.dropped: Counter[str] = Counter()
        self.sanitised: Counter[tuple[str, str]] = Counter()
        self.logs_received: Counter[tuple[str, str]] = Counter()
        self.logs_rejected: Counter[tuple[str, str]] = Counter()

    def add_received(self, receiver: str, n: int) -> None:
        with self._lock:
            self.received[receiver] += n

    def add_rejected(self, receiver: str, reason: str, n: int = 1) -> None:
        with self._lock:
            self.rejected[(receiver, reason)] += n

    def add_dropped(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.dropped[reason] += n

    def add_sanitised(self, receiver: str, reason: str, n: int = 1) -> None:
        with self._lock:
            self.sanitised[(receiver, reason)] += n

    def add_logs_received(self, receiver: str, event: str, n: int = 1) -> None:
        """``event``: :data:`EVALUATION_EVENT` or :data:`LOG_EVENT_OTHER`."""
        with self._lock:
            self.logs_received[(receiver, event)] += n

    def add_logs_rejected(self, receiver: str, reason: str, n: int = 1) -> None:
        with self._lock:
            self.logs_rejected[(receiver, reason)] += n

    def logs_snapshot(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """(``logs_received``, ``logs_rejected``) copied under the lock."""
        with self._lock:
            return dict(self.logs_received), dict(self.logs_rejected)

    def sanitised_snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.sanitised)

    def snapshot(self) -> tuple[dict[str, int], dict[tuple[str, str], int], dict[str, int]]:
        with self._lock:
            return dict(self.received), dict(self.rejected), dict(self.dropped)
