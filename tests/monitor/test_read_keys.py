"""The monitor decodes only the attribute keys its pipeline reads (``READ_KEYS``).

The receivers of ``assaywatch monitor`` decode with ``monitor_decode_limits()``
(``keep_keys=READ_KEYS``, ``keep_prefixes=READ_PREFIXES``, and the common span classified
while decoding): an attribute the normalizer reads but the list forgets
would silently change runs. These tests record every key the pipeline looks up on spans of
every dialect and check it is listed, check that runs built from filtered spans equal the
runs built from full spans, and that the decoders' filter keeps exactly the listed keys
while the default keeps everything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from assaywatch.monitor.pipeline.assemble import assemble_all
from assaywatch.monitor.pipeline.dialects import READ_KEYS, READ_PREFIXES
from assaywatch.monitor.pipeline.normalize import classify, monitor_decode_limits
from assaywatch.monitor.pipeline.runs import Node
from assaywatch.monitor.receivers.files import request_to_json
from assaywatch.monitor.receivers.otlp.decode import (
    DecodeLimits,
    decode_proto_request,
)
from assaywatch.monitor.receivers.otlp.decode_json import decode_json_request
from assaywatch.monitor.receivers.spans import AttrValue, SpanEvent, SpanRecord
from tests.e2e.rawotlp import request_from_records
from tests.monitor.spanfactory import (
    DIALECTS,
    Agent,
    EvalSpec,
    Handoff,
    Llm,
    Retrieve,
    SpanFactory,
    Tool,
    nine_span_agent,
    tool_agent,
)

MONITOR_LIMITS = monitor_decode_limits()


def _kept(key: str) -> bool:
    return key in READ_KEYS or key.startswith(READ_PREFIXES)


class Recording(dict[str, AttrValue]):
    """A dict that records the keys looked up by ``get`` / ``in`` / ``[]``."""

    seen: set[str]

    def __init__(self, data: dict[str, AttrValue], seen: set[str]) -> None:
        super().__init__(data)
        self.seen = seen

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.seen.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return super().__contains__(key)

    def __getitem__(self, key: str) -> AttrValue:
        self.seen.add(key)
        return super().__getitem__(key)


def corpus() -> Iterator[list[SpanRecord]]:
    """Traces of every dialect exercising every branch the normalizer has."""
    for i, dialect in enumerate(DIALECTS):
        for content in (True, False):
            # distinct seeds: distinct trace ids across dialects
            f = SpanFactory(seed=2 * i + content, capture_content=content,
                            service_version="2.1")
            yield f.agent_run(nine_span_agent(), dialect)
            yield f.agent_run(tool_agent(), dialect)
            ev = Agent(name="judged", steps=[Llm(cost_usd=0.002), Tool("x", error=True),
                                             Tool("x"), Handoff("billing")],
                       evaluation=EvalSpec(label="correct", score=0.9, passed=True),
                       tool_definitions=("x", "y"), error=True)
            yield f.agent_run(ev, dialect)
            yield f.agent_run(replace(ev, evaluation=EvalSpec(score=0.2, as_event=True)),
                              dialect)
            nested = Agent(name="outer", steps=[Agent(name="inner", steps=[Llm()]),
                                                Retrieve("kb")])
            yield f.http_request([nested, tool_agent()], dialect)
            yield f.bare_trace([Llm(), Tool("calc")], dialect)


def _filtered(span: SpanRecord) -> SpanRecord:
    def keep(attrs: dict[str, AttrValue]) -> dict[str, AttrValue]:
        return {k: v for k, v in attrs.items() if _kept(k)}

    return replace(span, attributes=keep(span.attributes), resource=keep(span.resource),
                   events=[SpanEvent(e.name, e.time_ns, keep(e.attributes))
                           for e in span.events])


def test_every_key_the_pipeline_reads_is_listed() -> None:
    seen: set[str] = set()
    n_spans = 0
    for trace in corpus():
        for span in trace:
            n_spans += 1
            rec = replace(span, attributes=Recording(span.attributes, seen),
                          resource=Recording(span.resource, seen),
                          events=[SpanEvent(e.name, e.time_ns, Recording(e.attributes, seen))
                                  for e in span.events])
            Node(rec, classify(rec))
    assert n_spans > 300
    # the recorder works: it saw the dialect markers and the resource keys
    assert {"gen_ai.operation.name", "openinference.span.kind", "service.name"} <= seen
    missing = sorted(k for k in seen if not _kept(k))
    assert not missing, f"keys read by the pipeline but missing from READ_KEYS: {missing}"


def test_runs_from_filtered_spans_equal_runs_from_full_spans() -> None:
    full: list[SpanRecord] = []
    for trace in corpus():
        full.extend(trace)
    dropped = sum(len(s.attributes) for s in full) - sum(
        len(_filtered(s).attributes) for s in full)
    assert dropped > 100  # the corpus carries content the filter removes
    for span in full:
        assert classify(_filtered(span)) == classify(span), span.name
    runs_full = assemble_all(full)
    assert len(runs_full) > 60  # 10 factories x 7 runs
    assert assemble_all([_filtered(s) for s in full]) == runs_full


def _request_spans() -> list[SpanRecord]:
    f = SpanFactory(seed=3, capture_content=True)
    spans = f.agent_run(tool_agent(), "genai") + f.agent_run(tool_agent(), "openinference")
    for s in spans:
        s.attributes["http.url"] = "https://example.invalid/x"
        s.attributes["assaywatch.release"] = "r1"
        s.resource["host.name"] = "box"
    return spans


@pytest.mark.parametrize("fmt", ["proto", "json"])
def test_decoders_keep_only_listed_keys_when_asked(fmt: str) -> None:
    req = request_from_records(_request_spans())

    def decode(limits: DecodeLimits | None) -> list[SpanRecord]:
        if fmt == "proto":
            return decode_proto_request(req.SerializeToString(), limits).spans
        return decode_json_request(json.dumps(request_to_json(req)), limits).spans

    full, kept = decode(None), decode(MONITOR_LIMITS)
    assert len(full) == len(kept) > 0
    assert any("http.url" in s.attributes for s in full)  # default: everything kept
    assert any("host.name" in s.resource for s in full)
    for a, b in zip(full, kept, strict=True):
        assert b == _filtered(a)
        assert b.attributes["assaywatch.release"] == "r1"  # prefix kept
        assert "http.url" not in b.attributes and "host.name" not in b.resource


def test_json_filter_still_rejects_a_span_with_a_malformed_skipped_value() -> None:
    req = request_from_records(_request_spans()[:1])
    doc = request_to_json(req)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["attributes"].append({"key": "http.url", "value": {"stringValue": 5}})
    full = decode_json_request(doc)
    kept = decode_json_request(doc, MONITOR_LIMITS)
    assert full.rejected_count == 1
    assert kept.rejected == full.rejected and not kept.spans


def test_decode_limits_reject_a_mutable_key_set() -> None:
    with pytest.raises(ValueError, match="keep_keys must be a frozenset"):
        DecodeLimits(keep_keys={"a"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep_prefixes must be a tuple"):
        DecodeLimits(keep_prefixes="assaywatch.")  # type: ignore[arg-type]
