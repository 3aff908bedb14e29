"""The compiled protobuf decoder (native/, ``assaywatch_native``) gives exactly what the
Python decoder gives: the same records (every field, values of the same types, dict key
order), the same rejected / limited / sanitised counts, the same errors.

The decoder's own tests run under both decoders (``tests/monitor/decoders.py``); here
generated requests cover what hand-written cases miss: every AnyValue kind nested in arrays
and maps, invalid and zero ids, names and label values past 256 characters, values past the
byte cap, attributes and events past their caps, out-of-range and reversed times, kept and
skipped keys, and byte-level corruption of valid requests (where both must refuse the same
bytes with the same message, or decode them to the same records).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from assaywatch.monitor.pipeline.assemble import kept_bytes
from assaywatch.monitor.pipeline.dialects import (
    INPUT_TOKEN_KEYS,
    MODEL_KEYS,
    OPERATION_KINDS,
    OUTPUT_TOKEN_KEYS,
    PROVIDER_KEYS,
    READ_KEYS,
    READ_PREFIXES,
    Kind,
)
from assaywatch.monitor.pipeline.normalize import (
    NormalizedSpan,
    classify,
    monitor_decode_limits,
    native_classify_context,
)
from assaywatch.monitor.pipeline.outcome import Evaluation
from assaywatch.monitor.receivers.otlp import decode as decode_module
from assaywatch.monitor.receivers.otlp.bounds import MIN_TIME_NS
from assaywatch.monitor.receivers.otlp.decode import DecodeError, DecodeLimits, DecodeResult
from assaywatch.monitor.receivers.spans import SpanBatch
from assaywatch.monitor.service.pipeline import batch_bytes
from tests.e2e.rawotlp import genai_run_script, request_from_records
from tests.monitor.decoders import NATIVE_INSTALLED
from tests.monitor.sdkspans import same_values
from tests.monitor.spanfactory import SpanFactory

pytestmark = pytest.mark.skipif(
    not NATIVE_INSTALLED,
    reason="the compiled decoder is not installed (pip install ./native, needs Rust)")

LONG_KEY = "x." + "k" * 300
#: Limits the generated requests are decoded with: the defaults, tiny caps that every
#: request hits, and the monitor's kept keys (plus a kept key past 256 characters).
LIMITS = [
    DecodeLimits(),
    DecodeLimits(max_value_bytes=6, max_attributes=2, max_events=1),
    DecodeLimits(keep_keys=frozenset(READ_KEYS) | {LONG_KEY}, keep_prefixes=READ_PREFIXES),
    DecodeLimits(max_value_bytes=0, max_attributes=0, max_events=0,
                 keep_keys=frozenset({"gen_ai.agent.name"}), keep_prefixes=("kept.",)),
]
KEYS = ["gen_ai.operation.name", "gen_ai.agent.name", "service.name", "gen_ai.usage.input_tokens",
        "kept.a", "other", "llm.token_count.prompt", LONG_KEY, "", "é.ключ"]
TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["chat", "é" * 5, "日本語テキスト", "x" * 300, "é" * 300, "𝄞" * 260]),
)
TIMES = [0, MIN_TIME_NS - 1, MIN_TIME_NS, 1_700_000_000 * 10**9, 1_700_000_000 * 10**9 + 7,
         2**64 - 1]


def _any_values() -> st.SearchStrategy[AnyValue]:
    scalars = st.one_of(
        TEXT.map(lambda s: AnyValue(string_value=s)),
        st.booleans().map(lambda b: AnyValue(bool_value=b)),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
        st.floats(allow_nan=True, allow_infinity=True).map(lambda f: AnyValue(double_value=f)),
        st.binary(max_size=10).map(lambda b: AnyValue(bytes_value=b)),
        st.just(AnyValue()),
        st.just(AnyValue(string_value_strindex=3)),
    )

    def nest(children: st.SearchStrategy[AnyValue]) -> st.SearchStrategy[AnyValue]:
        def array(vs: list[AnyValue]) -> AnyValue:
            v = AnyValue()
            v.array_value.values.extend(vs)
            return v

        def kvlist(kvs: list[tuple[str, AnyValue]]) -> AnyValue:
            v = AnyValue()
            v.kvlist_value.values.extend(KeyValue(key=k, value=x) for k, x in kvs)
            return v

        return st.one_of(st.lists(children, max_size=3).map(array),
                         st.lists(st.tuples(st.sampled_from(KEYS), children),
                                  max_size=3).map(kvlist))

    return st.recursive(scalars, nest, max_leaves=6)


ATTRS = st.lists(st.tuples(st.sampled_from(KEYS), _any_values()), max_size=5).map(
    lambda kvs: [KeyValue(key=k, value=v) for k, v in kvs])
IDS16 = st.sampled_from([bytes(range(1, 17)), bytes(range(2, 18)), bytes(16), b"", bytes(15)])
IDS8 = st.sampled_from([bytes(range(1, 9)), bytes(range(3, 11)), bytes(8), b"", bytes(7)])


@st.composite
def _spans(draw: Any) -> Span:
    sp = Span(trace_id=draw(IDS16), span_id=draw(IDS8), parent_span_id=draw(IDS8),
              name=draw(TEXT), kind=draw(st.integers(-2, 7)),
              start_time_unix_nano=draw(st.sampled_from(TIMES)),
              end_time_unix_nano=draw(st.sampled_from(TIMES)))
    sp.attributes.extend(draw(ATTRS))
    for _ in range(draw(st.integers(0, 3))):
        ev = sp.events.add(name=draw(TEXT), time_unix_nano=draw(st.sampled_from(TIMES)))
        ev.attributes.extend(draw(ATTRS))
    if draw(st.booleans()):
        sp.status.CopyFrom(Status(code=draw(st.integers(-1, 4)), message=draw(TEXT)))
    if draw(st.booleans()):
        link = sp.links.add(trace_id=draw(IDS16), span_id=draw(IDS8), trace_state="k=v")
        link.attributes.extend(draw(ATTRS))
    return sp


@st.composite
def _requests(draw: Any) -> bytes:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rs = req.resource_spans.add()
        if draw(st.booleans()):
            rs.resource.attributes.extend(draw(ATTRS))
        for _ in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add()
            if draw(st.booleans()):
                ss.scope.name = draw(TEXT)
            ss.spans.extend(draw(st.lists(_spans(), max_size=4)))
    return req.SerializeToString()


def _decode(data: bytes, limits: DecodeLimits, native: bool,
            monkeypatch: pytest.MonkeyPatch, **caps: Any) -> DecodeResult | DecodeError:
    monkeypatch.setenv(decode_module.NATIVE_ENV, "1" if native else "0")
    try:
        return decode_module.decode_proto_request(data, limits, **caps)
    except DecodeError as exc:
        return exc


def _fields(r: Any) -> tuple[Any, ...]:
    return (r.trace_id, r.span_id, r.parent_span_id, r.name, r.start_ns, r.end_ns, r.kind,
            r.status_code, r.status_message, r.attributes,
            [(e.name, e.time_ns, e.attributes) for e in r.events], r.resource, r.scope_name)


def assert_same(py: DecodeResult | DecodeError, nat: DecodeResult | DecodeError) -> None:
    if isinstance(py, DecodeError) or isinstance(nat, DecodeError):
        assert isinstance(py, DecodeError) and isinstance(nat, DecodeError), (py, nat)
        assert (py.reason, py.message, py.status) == (nat.reason, nat.message, nat.status)
        return
    assert len(py.spans) == len(nat.spans)
    for a, b in zip(py.spans, nat.spans, strict=True):
        assert same_values(_fields(a), _fields(b)), (_fields(a), _fields(b))
        assert type(b) is type(a)
    # spans of one ResourceSpans share one resource dict in both
    assert ([id(s.resource) for s in py.spans].count(id(py.spans[0].resource))
            == [id(s.resource) for s in nat.spans].count(id(nat.spans[0].resource))
            if py.spans else True)
    assert (py.rejected, py.limited, py.sanitised) == (nat.rejected, nat.limited, nat.sanitised)
    # the compiled decoder's batch carries the queue's byte estimate, or None
    if isinstance(nat.spans, SpanBatch) and nat.spans.nbytes is not None:
        assert_estimate(nat.spans)


def _shared_chars(records: list[Any]) -> int:
    """Values that are one of CPython's shared one-character strings beyond ASCII."""
    def n(attrs: dict[str, Any]) -> int:
        return sum(1 for v in attrs.values()
                   if isinstance(v, str) and len(v) == 1 and 128 <= ord(v) < 256)
    resources = {id(r.resource): r.resource for r in records}
    return (sum(n(r.attributes) + sum(n(e.attributes) for e in r.events) for r in records)
            + sum(map(n, resources.values())))


def assert_estimate(batch: SpanBatch) -> None:
    """The decoder's estimate is ``batch_bytes`` of its records, up to the UTF-8 copy
    (3 bytes) CPython may have cached on a shared one-character string (U+0080-U+00FF)
    another test asked for: ``sys.getsizeof`` counts it, the decoder cannot know it."""
    exact = batch_bytes(list(batch))
    assert batch.nbytes is not None
    assert 0 <= exact - batch.nbytes <= 3 * _shared_chars(batch), (batch.nbytes, exact)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=_requests(), which=st.integers(0, len(LIMITS) - 1))
def test_generated_requests_decode_the_same_with_both_decoders(
        data: bytes, which: int, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = LIMITS[which]
    py = _decode(data, limits, False, monkeypatch)
    assert isinstance(py, DecodeResult)  # a valid request
    assert_same(py, _decode(data, limits, True, monkeypatch))


def test_a_request_past_max_spans_is_refused_the_same_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    req = ExportTraceServiceRequest()
    spans = req.resource_spans.add().scope_spans.add().spans
    for i in range(5):
        spans.add(trace_id=bytes(range(1, 17)), span_id=bytes([i + 1]) * 8, name="s")
    data = req.SerializeToString()
    for native in (False, True):
        out = _decode(data, DecodeLimits(), native, monkeypatch, max_spans=4)
        assert isinstance(out, DecodeError)
        assert (out.reason, out.status) == ("too_many_spans", 413)
        assert "request holds 5 spans, more than the 4" in out.message
        ok = _decode(data, DecodeLimits(), native, monkeypatch, max_spans=5)
        assert isinstance(ok, DecodeResult) and len(ok.spans) == 5


def test_corrupted_requests_are_refused_or_decoded_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1,500 valid requests with 1-4 random bytes replaced, cut or a wrong wire type: both
    decoders refuse the same ones with the same message and decode the others alike."""
    rng = random.Random(20261204)
    bases = [_seeded_request(seed) for seed in range(30)]
    for seed, base in enumerate(bases):
        # intact, the estimate is there and right; left to Python with an array value
        nat = _decode(base, DecodeLimits(), True, monkeypatch)
        assert isinstance(nat, DecodeResult) and isinstance(nat.spans, SpanBatch)
        if seed % 2:
            assert nat.spans.nbytes is None
        else:
            assert_estimate(nat.spans)
        assert batch_bytes(nat.spans) > 600 * len(nat.spans)
    refused = decoded = 0
    for i in range(1500):
        base = bytearray(bases[i % len(bases)])
        if not base:
            continue
        for _ in range(rng.randint(1, 4)):
            base[rng.randrange(len(base))] = rng.randrange(256)
        if i % 7 == 0:
            base = base[: rng.randrange(len(base))]
        data = bytes(base)
        limits = LIMITS[i % len(LIMITS)]
        py = _decode(data, limits, False, monkeypatch)
        assert_same(py, _decode(data, limits, True, monkeypatch))
        refused += isinstance(py, DecodeError)
        decoded += isinstance(py, DecodeResult)
    # both outcomes happen, so both branches of the comparison were exercised
    assert refused > 100 and decoded > 100, (refused, decoded)


def _seeded_request(seed: int) -> bytes:
    """A valid request of a few spans with every value kind, built from ``seed``."""
    rng = random.Random(seed)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = f"svc-{seed}"
    ss = rs.scope_spans.add()
    ss.scope.name = "scope"
    for j in range(rng.randint(1, 4)):
        sp = ss.spans.add(trace_id=bytes(range(seed % 7 + 1, seed % 7 + 17)),
                          span_id=bytes([j + 1]) * 8, parent_span_id=b"" if j == 0 else b"\1" * 8,
                          name=rng.choice(["chat m", "execute_tool t", "é" * 10]),
                          kind=rng.randint(0, 5), start_time_unix_nano=TIMES[3],
                          end_time_unix_nano=TIMES[3] + rng.randint(0, 10**9))
        sp.attributes.add(key="gen_ai.operation.name").value.string_value = "chat"
        sp.attributes.add(key="gen_ai.usage.input_tokens").value.int_value = rng.randint(0, 10**6)
        sp.attributes.add(key="kept.f").value.double_value = rng.random()
        sp.attributes.add(key="kept.b").value.bool_value = True
        sp.attributes.add(key="kept.s").value.string_value = rng.choice(["a", "é", "日本", "𝄞x"])
        sp.attributes.add(key="kept.n").value.int_value = rng.choice([0, -1, 2**40, -(2**63)])
        sp.attributes.add(key="kept.bytes").value.bytes_value = b"\0\1"
        if seed % 2:  # an array value: the compiled decoder leaves the estimate to Python
            arr = sp.attributes.add(key="kept.arr").value.array_value.values
            arr.add().string_value = "a"
            arr.add().bytes_value = b"\0\1"
        ev = sp.events.add(name="gen_ai.choice", time_unix_nano=TIMES[3])
        ev.attributes.add(key="other").value.string_value = "x"
        sp.status.message = "failed"
        sp.status.code = 2
    return req.SerializeToString()


def test_a_wrong_wire_type_and_invalid_utf8_are_judged_as_upb_judges_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-made edge cases of the protobuf format: a known field with another wire type,
    invalid UTF-8 in a string field the decoder does not read (a link's trace state),
    an unknown field, an empty message."""
    good = _seeded_request(1)
    cases = {
        # field 1 (resource_spans, a message) as a varint
        "wrong_wire_type": bytes([0x08, 0x01]) + good,
        # an unknown field 99 (varint) before a valid request
        "unknown_field": bytes([0x98, 0x06, 0x01]) + good,
        "empty": b"",
    }
    req = ExportTraceServiceRequest.FromString(good)
    link = req.resource_spans[0].scope_spans[0].spans[0].links.add(trace_state="ok")
    raw = req.SerializeToString()
    cases["invalid_utf8_in_trace_state"] = raw.replace(b"\x1a\x02ok", b"\x1a\x02\xff\xfe")
    assert link.trace_state == "ok" and cases["invalid_utf8_in_trace_state"] != raw
    for name, data in cases.items():
        py = _decode(data, DecodeLimits(), False, monkeypatch)
        assert_same(py, _decode(data, DecodeLimits(), True, monkeypatch)), name
    assert isinstance(_decode(cases["invalid_utf8_in_trace_state"], DecodeLimits(), False,
                              monkeypatch), DecodeError)


def test_nesting_is_refused_at_the_same_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays nested in an attribute: 47 levels (99 messages deep with the request's own)
    decode, 48 are refused by both decoders (protobuf's limit of 100), so the compiled
    parser neither accepts what upb refuses nor recurses deeper."""
    def nested(depth: int) -> bytes:
        req = ExportTraceServiceRequest()
        sp = req.resource_spans.add().scope_spans.add().spans.add(
            trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name="s")
        v = sp.attributes.add(key="k").value
        for _ in range(depth):
            v = v.array_value.values.add()
        v.int_value = 1
        return req.SerializeToString()

    for depth, ok in ((47, True), (48, False)):
        py = _decode(nested(depth), DecodeLimits(), False, monkeypatch)
        assert isinstance(py, DecodeResult) == ok
        assert_same(py, _decode(nested(depth), DecodeLimits(), True, monkeypatch))
        try:
            decode_module._native_decoder(DecodeLimits()).decode(nested(depth), 2**62, None)
            native_ok = True
        except ValueError:
            native_ok = False
        assert native_ok == ok


# --------------------------------------------------------------------------- classification

#: Values a generated GenAI span draws its attributes from: every operation plus unknown
#: and malformed ones, names that are strings, empty, numbers or unset, token counts of
#: every type, renamed providers, handoff names, the keys that send a span to ``classify``.
_OPS = [*OPERATION_KINDS, "custom_op", "", AnyValue(int_value=3), AnyValue()]
_NAMES = ["billing", "", "transfer_to_billing", "é" * 9, AnyValue(int_value=7),
          AnyValue(bool_value=True), AnyValue(double_value=1.5), AnyValue()]
_TOKENS = [AnyValue(int_value=12), AnyValue(int_value=0), AnyValue(int_value=-4),
           "12", "", AnyValue(double_value=3.0), AnyValue(bool_value=True), AnyValue()]
_SIMPLE: dict[str, list[Any]] = {
    "gen_ai.tool.name": _NAMES, "gen_ai.agent.name": _NAMES, "agent.name": _NAMES,
    "gen_ai.agent.version": _NAMES, "gen_ai.workflow.name": _NAMES,
    "assaywatch.scenario": _NAMES, "traceloop.workflow.name": _NAMES,
    **{k: _NAMES + ["gpt-4o"] for k in MODEL_KEYS},
    **{k: _NAMES + ["gemini", "az.ai.openai", "openai"] for k in PROVIDER_KEYS},
    **{k: _TOKENS for k in (*INPUT_TOKEN_KEYS, *OUTPUT_TOKEN_KEYS)},
    "gen_ai.tool.call.id": ["call_1"], "tool.name": ["lookup"], "service.name": ["svc"],
    "http.method": ["GET"],
    # an evaluation given as attributes: numeric, NaN, infinite, string and bool scores,
    # bool, string and int pass flags
    "gen_ai.evaluation.name": _NAMES, "gen_ai.evaluation.score.label": _NAMES + ["Correct"],
    "gen_ai.evaluation.score.value": [
        AnyValue(double_value=0.8), AnyValue(int_value=1), AnyValue(double_value=math.nan),
        AnyValue(double_value=-math.inf), "0.7", AnyValue(bool_value=True), AnyValue()],
    "assaywatch.evaluation.passed": [
        AnyValue(bool_value=True), AnyValue(bool_value=False), "true", " TRUE ", "no",
        AnyValue(int_value=1), AnyValue()],
}
_COMPLEX = ["error.type", "assaywatch.output.length",
            "assaywatch.run.mark", "gen_ai.transfer.target.name", "traceloop.span.kind",
            "langfuse.observation.type", "gen_ai.tool.definitions", "llm.cost.total",
            "gen_ai.output.messages", "llm.output_messages.0.message.content",
            "langfuse.observation.usage_details", "openinference.span.kind"]
_CLASSIFY_LIMITS = [monitor_decode_limits(),
                    DecodeLimits(classify=native_classify_context),
                    DecodeLimits(max_value_bytes=4, max_attributes=3,
                                 classify=native_classify_context)]


def _set(sp: Span, key: str, value: Any) -> None:
    v = sp.attributes.add(key=key).value
    if isinstance(value, AnyValue):
        v.CopyFrom(value)
    else:
        v.string_value = value


def _genai_request(rng: random.Random, n: int, tag: int) -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for j in range(n):
        sp = ss.spans.add(
            trace_id=bytes([tag % 250 + 1]) * 16, span_id=(j + 1).to_bytes(8, "big"),
            parent_span_id=rng.choice([b"", b"\1" * 8, bytes(8)]),
            name=rng.choice(["chat gpt", "handoff to billing", "handoff to ", "", "agent",
                             "execute_tool lookup"]),
            kind=rng.randint(0, 5), start_time_unix_nano=TIMES[3], end_time_unix_nano=TIMES[4])
        op = rng.choice(_OPS)
        _set(sp, "gen_ai.operation.name", op)
        if op == "execute_tool" and rng.random() < 0.7:
            _set(sp, "gen_ai.tool.name", rng.choice(_NAMES))
        for key in rng.sample(sorted(_SIMPLE), rng.randint(0, 8)):
            _set(sp, key, rng.choice(_SIMPLE[key]))
        if rng.random() < 0.3:
            _set(sp, rng.choice(_COMPLEX), "x")
        if rng.random() < 0.1:  # a repeated key: the last value is the one kept
            _set(sp, "gen_ai.tool.name", rng.choice(_NAMES))
        if rng.random() < 0.15:
            sp.events.add(name=rng.choice(["exception", "log"]), time_unix_nano=TIMES[3])
        if rng.random() < 0.3:
            sp.status.code = rng.randint(0, 2)
    return req.SerializeToString()


def _typed(norm: NormalizedSpan) -> list[tuple[type, Any]]:
    """Every compared field with its type: ``True == 1`` must not hide a bool for an int
    (``nbytes``, derived, is checked on its own)."""
    return [(type(getattr(norm, f.name)), getattr(norm, f.name))
            for f in dataclasses.fields(norm) if f.compare]


def test_spans_classified_while_decoding_are_classified_as_classify_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 generated GenAI-like spans: every ``NormalizedSpan`` the compiled decoder makes
    equals ``classify`` of the same record, field by field with its type (the same Kind
    object); it makes one for some spans of every operation but ``handoff`` and for none
    carrying an event or a key it leaves to ``classify``."""
    rng = random.Random(1204)
    made: Counter[str] = Counter()
    left = evaluated = 0
    handoff_named = 0  # tool spans only a "handoff to" name sends to classify
    for i in range(100):
        data = _genai_request(rng, 30, i)
        out = _decode(data, _CLASSIFY_LIMITS[i % 3], True, monkeypatch)
        assert isinstance(out, DecodeResult)
        for rec in out.spans:
            if rec.norm is None:
                left += 1
                handoff_named += (rec.name.startswith("handoff to ") and not rec.events
                                  and rec.attributes.get("gen_ai.operation.name")
                                  == "execute_tool")
                continue
            expected = classify(rec)
            assert _typed(rec.norm) == _typed(expected), rec
            # the byte estimate of its kept values, made while decoding, is the Python one
            assert expected.nbytes == -1 and rec.norm.nbytes == kept_bytes(expected) >= 0
            assert rec.norm.kind is expected.kind and rec.norm.action is expected.action
            assert not rec.events and not gc.is_tracked(rec.norm)
            assert not any(k in rec.attributes for k in _COMPLEX), rec.attributes
            made[rec.attributes["gen_ai.operation.name"]] += 1
            evaluated += bool(rec.norm.evaluations)
    assert set(made) == set(OPERATION_KINDS) - {"handoff"}, made
    assert evaluated > 30, evaluated  # the evaluation branch is exercised
    assert left > 500 and handoff_named > 10, (left, handoff_named)


def test_the_common_span_is_classified_while_decoding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Written-down cases: a chat span and a tool span get their NormalizedSpan from the
    decoder; a transfer tool, an event, an evaluation key, a float token count and the
    Python decoder leave it to the assembler (``norm`` None)."""
    req = ExportTraceServiceRequest()
    spans = req.resource_spans.add().scope_spans.add().spans

    def span(name: str, **attrs: Any) -> Span:
        sp = spans.add(trace_id=b"\7" * 16, span_id=(len(spans) + 1).to_bytes(8, "big"),
                       parent_span_id=b"\1" * 8, name=name, kind=3,
                       start_time_unix_nano=TIMES[3], end_time_unix_nano=TIMES[4])
        for k, v in attrs.items():
            _set(sp, k.replace("__", "."), v)
        return sp

    span("chat gpt", gen_ai__operation__name="chat", gen_ai__system="gemini",
         gen_ai__request__model="gemini-2", gen_ai__usage__input_tokens=AnyValue(int_value=30),
         gen_ai__usage__output_tokens=AnyValue(int_value=-2))
    span("execute_tool lookup", gen_ai__operation__name="execute_tool",
         gen_ai__tool__name="lookup")
    span("execute_tool t", gen_ai__operation__name="execute_tool",
         gen_ai__tool__name="transfer_to_billing")
    span("chat gpt", gen_ai__operation__name="chat").events.add(name="exception")
    span("chat gpt", gen_ai__operation__name="chat", gen_ai__evaluation__name="q",
         gen_ai__evaluation__score__value="0.9")  # a score as text: classify parses it
    span("chat gpt", gen_ai__operation__name="chat",
         gen_ai__usage__input_tokens=AnyValue(double_value=3.0))
    span("invoke_agent a", gen_ai__operation__name="invoke_agent", gen_ai__agent__name="a",
         gen_ai__evaluation__name="q", gen_ai__evaluation__score__value=AnyValue(
             double_value=0.25), assaywatch__evaluation__passed=AnyValue(bool_value=False))
    data = req.SerializeToString()
    out = _decode(data, DecodeLimits(classify=native_classify_context), True, monkeypatch)
    assert isinstance(out, DecodeResult)
    chat, tool, *others, evaluated = out.spans
    assert (chat.norm.kind, chat.norm.provider, chat.norm.model, chat.norm.input_tokens,
            chat.norm.output_tokens, chat.norm.output_length, chat.norm.error) == (
        Kind.LLM, "gcp.gemini", "gemini-2", 30, 0, 0, False)
    assert (tool.norm.kind, tool.norm.tool, tool.norm.is_agent_span) == (Kind.TOOL, "lookup",
                                                                        False)
    assert [r.norm for r in others] == [None, None, None, None]
    # an evaluation given as attributes, with a numeric score and a bool flag
    assert (evaluated.norm.agent_name, evaluated.norm.evaluations) == (
        "a", (Evaluation(name="q", score=0.25, passed=False),))
    assert evaluated.norm.nbytes == len("a") + 200
    py = _decode(data, DecodeLimits(classify=native_classify_context), False, monkeypatch)
    assert isinstance(py, DecodeResult) and all(r.norm is None for r in py.spans)
    unasked = _decode(data, DecodeLimits(), True, monkeypatch)  # limits without the tables
    assert isinstance(unasked, DecodeResult) and all(r.norm is None for r in unasked.spans)
    assert monitor_decode_limits(["team"]).classify is None  # key attributes: assembler


def test_classified_spans_keep_no_attributes_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``DecodeLimits(classified_attributes=False)`` (a monitor without a write-ahead
    log): a span classified while decoding keeps an empty attribute dict, its
    ``NormalizedSpan`` unchanged; a span left to ``classify`` keeps its attributes; every
    other field, the counters and the classification are those of the default; the byte
    estimate is ``batch_bytes`` of the records as they are (smaller)."""
    rng = random.Random(17)
    data = _genai_request(rng, 800, 5)  # about one in six the decoder classifies
    kept = _decode(data, _CLASSIFY_LIMITS[0], True, monkeypatch)
    lean = _decode(data, dataclasses.replace(_CLASSIFY_LIMITS[0], classified_attributes=False),
                   True, monkeypatch)
    assert isinstance(kept, DecodeResult) and isinstance(lean, DecodeResult)
    assert (kept.rejected, kept.limited, kept.sanitised) == (
        lean.rejected, lean.limited, lean.sanitised)
    n_classified = 0
    for a, b in zip(kept.spans, lean.spans, strict=True):
        assert same_values(_fields(a)[:9], _fields(b)[:9])
        assert same_values(_fields(a)[10:], _fields(b)[10:])
        if a.norm is None:  # NaN values compare as equal here
            assert b.norm is None and same_values(b.attributes, a.attributes)
        else:
            n_classified += 1
            assert _typed(b.norm) == _typed(a.norm) and b.norm.nbytes == a.norm.nbytes
            assert b.attributes == {} and a.attributes
    assert n_classified > 50
    # the estimate, on realistic GenAI runs (no key given twice, so the decoder gives one)
    spans = [sp for i in range(20) for sp in
             SpanFactory(seed=i, capture_content=False).agent_run(
                 genai_run_script(["lookup", "refund"]), "genai")]
    real = request_from_records(spans).SerializeToString()
    est = {}
    for flag in (True, False):
        out = _decode(real, dataclasses.replace(_CLASSIFY_LIMITS[0],
                                                classified_attributes=flag), True, monkeypatch)
        assert isinstance(out, DecodeResult) and isinstance(out.spans, SpanBatch)
        assert sum(r.norm is not None for r in out.spans) >= len(spans) * 0.8
        assert all(bool(r.attributes) == (flag or r.norm is None) for r in out.spans)
        assert_estimate(out.spans)
        est[flag] = out.spans.nbytes
    assert est[False] < est[True]
    with pytest.raises(ValueError, match="classified_attributes"):
        DecodeLimits(classified_attributes=1)  # type: ignore[arg-type]


def test_decoded_records_are_left_to_reference_counting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled decoder's records, their attribute dicts, event lists, events and
    NormalizedSpans are not tracked by the cycle collector (they hold no reference back,
    so no cycle), and a collection frees nothing a record still holds: an array value (a
    tuple, itself tracked) and the shared resource stay intact."""
    req = ExportTraceServiceRequest.FromString(_seeded_request(3))  # arrays and events
    sp = req.resource_spans[0].scope_spans[0].spans[0]
    sp.attributes.add(key="gen_ai.operation.name").value.string_value = "chat"
    data = req.SerializeToString()
    out = _decode(data, DecodeLimits(), True, monkeypatch)
    assert isinstance(out, DecodeResult)
    rec = out.spans[0]
    assert rec.events and isinstance(rec.attributes["kept.arr"], tuple)
    held = [rec, rec.attributes, rec.events, *rec.events]
    assert not any(gc.is_tracked(o) for o in held)
    py = _decode(data, DecodeLimits(), False, monkeypatch)
    assert isinstance(py, DecodeResult) and gc.is_tracked(py.spans[0])  # the Python decoder's
    del py, held
    gc.collect()
    again = _decode(data, DecodeLimits(), False, monkeypatch)
    assert isinstance(again, DecodeResult)
    assert same_values(_fields(rec), _fields(again.spans[0]))


def test_gc_untrack_stops_tracking_only_what_the_collector_tracks() -> None:
    """``gc_untrack`` returns its argument; with the compiled module a tracked tuple is no
    longer tracked (and still whole), and objects the collector never handles (strings,
    ints, None) pass through untouched; without it, nothing changes."""
    digest = tuple(["run", "agent", 1, tuple("ab")])  # made at run time: tracked
    assert gc.is_tracked(digest)
    assert decode_module._tracked_as_is(digest) is digest and gc.is_tracked(digest)
    if not NATIVE_INSTALLED:
        pytest.skip("the compiled module is not installed (pip install ./native)")
    assert decode_module.gc_untrack(digest) is digest
    assert not gc.is_tracked(digest) and digest == ("run", "agent", 1, ("a", "b"))
    for atom in ("text", 12345678901234567890, None, 1.5):
        assert decode_module.gc_untrack(atom) is atom
