"""Spans made by the real OTel SDK for the receiver and reader tests, and the check that
what arrived is exactly what was sent (ids, parentage, kind, times, status, attributes,
events, resource)."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from assaywatch.monitor.receivers.spans import SpanRecord


def same_values(x: Any, y: Any) -> bool:
    """Equal values of equal types (tuples stay tuples, dicts keep their key order), a NaN
    equal to a NaN: what a stored span record must give back."""
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x):
        return math.isnan(y)
    if isinstance(x, tuple | list) and isinstance(y, tuple | list):
        return type(x) is type(y) and len(x) == len(y) and all(map(same_values, x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return list(x) == list(y) and all(same_values(x[k], y[k]) for k in x)
    return type(x) is type(y) and x == y


def sdk_spans(n_runs: int = 2,
              chat_attributes: Mapping[str, Any] | None = None) -> list[Any]:
    """``n_runs`` small agent runs (agent, chat with an event, failed tool) as ReadableSpans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("assaywatch.test")
    attrs = dict(chat_attributes or {"gen_ai.request.model": "m"})
    for i in range(n_runs):
        with tracer.start_as_current_span("invoke_agent planner", attributes={"run": i}):
            with tracer.start_as_current_span("chat m", kind=SpanKind.CLIENT,
                                              attributes=attrs) as chat:
                chat.add_event("gen_ai.choice", {"index": 0})
            with tracer.start_as_current_span("execute_tool t") as tool:
                tool.set_status(Status(StatusCode.ERROR, "failed"))
    provider.shutdown()
    return list(exporter.get_finished_spans())


def assert_received_exactly(records: list[SpanRecord], spans: list[Any],
                            status_message: bool = True, event_times: bool = True) -> None:
    by_id = {r.span_id: r for r in records}
    assert len(records) == len(by_id) == len(spans)
    for s in spans:
        r = by_id[format(s.context.span_id, "016x")]
        assert r.trace_id == format(s.context.trace_id, "032x")
        assert r.parent_span_id == (format(s.parent.span_id, "016x") if s.parent else "")
        assert (r.name, r.kind, r.start_ns, r.end_ns) == (
            s.name, s.kind.value + 1, s.start_time, s.end_time)
        assert r.status_code == s.status.status_code.value
        if status_message:
            assert r.status_message == (s.status.description or "")
        assert r.attributes == dict(s.attributes)
        assert [(e.name, e.time_ns if event_times else 0, e.attributes) for e in r.events] == [
            (e.name, e.timestamp if event_times else 0, dict(e.attributes)) for e in s.events]
        assert r.resource == dict(s.resource.attributes)


class RecordingSink:
    """A SpanSink that records offered batches and refuses the first ``refuse`` offers
    (pipeline full); it checks every offer comes from ``receiver``."""

    def __init__(self, receiver: str, refuse: int = 0) -> None:
        self.receiver = receiver
        self.lock = threading.Lock()
        self.refuse = refuse
        self.offers = 0
        self.spans: list[SpanRecord] = []

    def offer(self, spans: list[SpanRecord], receiver: str) -> bool:
        assert receiver == self.receiver
        with self.lock:
            self.offers += 1
            if self.refuse > 0:
                self.refuse -= 1
                return False
            self.spans.extend(spans)
            return True
