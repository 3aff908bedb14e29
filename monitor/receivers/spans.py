"""The span record every receiver produces and the pipeline consumes.

Protocol types (protobuf messages, OTLP JSON dicts, Jaeger/Tempo documents) stay at the
receiver edge; the first thing a receiver does is turn them into ``SpanRecord``s.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

#: An OTLP AnyValue after decoding: arrays become tuples, kvlists dicts, bytes stay bytes.
AttrValue = str | bool | int | float | bytes | tuple[object, ...] | dict[str, object] | None

STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2


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


class SpanSink(Protocol):
    """Where receivers deliver decoded spans.

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


class IngestCounters:
    """Thread-safe counters behind ``assaywatch_spans_received_total`` and
    ``assaywatch_spans_rejected_total`` (and the other "every limit has a counter" ones).

    ``received[receiver]`` counts spans accepted into the pipeline;
    ``rejected[(receiver, reason)]`` counts spans (or requests, when no span could be
    decoded: reason says which) refused at the edge; ``dropped[reason]`` counts what the
    pipeline discarded later (late spans, evicted traces, stream limit, ...);
    ``sanitised[(receiver, reason)]`` counts values the edge repaired and kept (invalid
    UTF-8, names and label values cut, span times; ``receivers/otlp/bounds.py``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.received: Counter[str] = Counter()
        self.rejected: Counter[tuple[str, str]] = Counter()
        self.dropped: Counter[str] = Counter()
        self.sanitised: Counter[tuple[str, str]] = Counter()

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

    def sanitised_snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.sanitised)

    def snapshot(self) -> tuple[dict[str, int], dict[tuple[str, str], int], dict[str, int]]:
        with self._lock:
            return dict(self.received), dict(self.rejected), dict(self.dropped)
