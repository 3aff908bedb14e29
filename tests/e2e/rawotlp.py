"""Raw OTLP for end-to-end tests and benchmarks: SpanRecords to wire bytes, and senders.

The real OTel SDK encodes only what a well-behaved SDK would send; tests of bad input
need requests no SDK produces (missing ids, truncated bodies, bombs) and benchmarks need
requests serialized once and replayed. This module builds ``ExportTraceServiceRequest``
messages directly from :class:`~assaywatch.monitor.spans.SpanRecord`\\ s (the form
``tests.monitor.spanfactory`` emits in every dialect), renders them as protobuf or
OTLP/JSON, and sends them over a keep-alive ``http.client`` connection or a raw gRPC
channel whose ``Export`` method takes and returns bytes.

Everything talks to loopback addresses given by the caller (``HOST:PORT``).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span
from prometheus_client.parser import text_string_to_metric_families

from assaywatch.monitor.receivers.files import request_to_json
from assaywatch.monitor.receivers.spans import AttrValue, SpanRecord
from tests.monitor.spanfactory import Agent, Llm, SpanFactory, Tool

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

# --------------------------------------------------------------------------- encoding


def any_value(v: AttrValue | object) -> AnyValue:
    """One decoded attribute value back to an OTLP ``AnyValue`` (bool before int)."""
    out = AnyValue()
    if isinstance(v, bool):
        out.bool_value = v
    elif isinstance(v, int):
        out.int_value = v
    elif isinstance(v, float):
        out.double_value = v
    elif isinstance(v, str):
        out.string_value = v
    elif isinstance(v, bytes):
        out.bytes_value = v
    elif isinstance(v, (tuple, list)):
        out.array_value.values.extend(any_value(x) for x in v)
    elif isinstance(v, dict):
        out.kvlist_value.values.extend(key_values(v))
    return out


def key_values(attrs: Mapping[str, object]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attrs.items()]


def _ids(hex_id: str) -> bytes:
    return bytes.fromhex(hex_id) if hex_id else b""


def span_message(s: SpanRecord) -> Span:
    """A ``Span`` message holding everything the decoder reads back from ``s``."""
    sp = Span(trace_id=_ids(s.trace_id), span_id=_ids(s.span_id),
              parent_span_id=_ids(s.parent_span_id), name=s.name, kind=s.kind,  # type: ignore[arg-type]
              start_time_unix_nano=s.start_ns, end_time_unix_nano=s.end_ns)
    sp.attributes.extend(key_values(s.attributes))
    for e in s.events:
        ev = sp.events.add(name=e.name, time_unix_nano=e.time_ns)
        ev.attributes.extend(key_values(e.attributes))
    sp.status.code = s.status_code  # type: ignore[assignment]
    sp.status.message = s.status_message
    return sp


def request_from_records(spans: Iterable[SpanRecord]) -> ExportTraceServiceRequest:
    """Group spans by (resource, scope) into one request, as an SDK exporter would.

    Resources are grouped by content (spans of one service share one ResourceSpans),
    scopes by name, both in first-seen order.
    """
    req = ExportTraceServiceRequest()
    by_resource: dict[str, tuple[ResourceSpans, dict[str, object]]] = {}
    for s in spans:
        rkey = json.dumps(s.resource, sort_keys=True, default=repr)
        entry = by_resource.get(rkey)
        if entry is None:
            rs = req.resource_spans.add()
            rs.resource.attributes.extend(key_values(s.resource))
            entry = (rs, {})
            by_resource[rkey] = entry
        rs, scopes = entry
        ss = scopes.get(s.scope_name)
        if ss is None:
            ss = rs.scope_spans.add()
            ss.scope.name = s.scope_name
            scopes[s.scope_name] = ss
        ss.spans.append(span_message(s))  # type: ignore[attr-defined]
    return req


def proto_bytes(spans: Iterable[SpanRecord]) -> bytes:
    return request_from_records(spans).SerializeToString()


def json_bytes(spans: Iterable[SpanRecord]) -> bytes:
    return json.dumps(request_to_json(request_from_records(spans)),
                      separators=(",", ":")).encode()


def gzip_bytes(data: bytes, level: int = 6) -> bytes:
    c = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def gzip_bomb(inflated_bytes: int, member: int = 16 << 20) -> bytes:
    """A valid gzip body of ``inflated_bytes`` zeros (~1,000:1): one member of ``member``
    zeros compressed once and repeated (RFC 1952 allows concatenated members)."""
    n, rest = divmod(inflated_bytes, member)
    body = gzip_bytes(bytes(member), 9) * n
    return body + (gzip_bytes(bytes(rest), 9) if rest else b"")


# --------------------------------------------------------------------------- runs


def genai_run_script(rng_tools: Sequence[str], name: str = "bench-agent",
                     scenario: str = "support", passed: bool | None = None) -> Agent:
    """``invoke_agent`` + (chat, execute_tool) per tool: 1 + 2 * len(tools) spans.

    With four tools this is the realistic 9-span run of the monitor benchmark.
    """
    from tests.monitor.spanfactory import EvalSpec

    steps: list[Llm | Tool] = []
    for i, t in enumerate(rng_tools):
        steps.append(Llm(model="gpt-4o-mini", input_tokens=400 + 13 * i, output_tokens=40 + i,
                         output=f"calling {t}"))
        steps.append(Tool(t, result=f"result of {t}"))
    ev = None if passed is None else EvalSpec(passed=passed)
    return Agent(name=name, steps=list(steps), scenario=scenario, evaluation=ev,
                 output="done")


def live_factory(seed: int, service: str = "e2e-svc") -> SpanFactory:
    """A SpanFactory whose timestamps start now (the monitor's clock is monotonic, so
    wall-clock times only matter for step order, but realistic values are kinder)."""
    return SpanFactory(seed=seed, service_name=service, start_ns=time.time_ns(),
                       capture_content=False)


# --------------------------------------------------------------------------- senders


@dataclass
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes


class OtlpHttp:
    """A keep-alive OTLP/HTTP client on one ``http.client`` connection (reconnects when
    the server closed it, as it does after 413/415 answers)."""

    def __init__(self, address: str, timeout: float = 30.0) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port, self.timeout = host, int(port), timeout
        self._conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, content_type: str = PROTOBUF,
             headers: Mapping[str, str] | None = None, path: str = "/v1/traces") -> HttpReply:
        hdrs = {"Content-Type": content_type, **(headers or {})}
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port,
                                                        timeout=self.timeout)
            try:
                try:
                    self._conn.request("POST", path, body=body, headers=hdrs)
                except (BrokenPipeError, ConnectionResetError):
                    # The server answered early (413 on Content-Length) and closed before
                    # reading the body; its answer is still waiting in our socket.
                    pass
                resp = self._conn.getresponse()
                data = resp.read()
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
                continue
            reply = HttpReply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
            if reply.headers.get("connection", "").lower() == "close":
                self.close()
            return reply
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class OtlpGrpc:
    """A raw gRPC channel calling ``TraceService/Export`` with serialized bytes."""

    def __init__(self, address: str, max_send: int = 256 * 1024 * 1024) -> None:
        self.channel = grpc.insecure_channel(
            address, options=[("grpc.max_send_message_length", max_send),
                              ("grpc.enable_http_proxy", 0)])
        self.export = self.channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                                               response_deserializer=None)

    def send(self, body: bytes, timeout: float = 30.0,
             compression: grpc.Compression | None = None,
             ) -> tuple[grpc.StatusCode, str, ExportTraceServiceResponse | None]:
        """(status code, details, parsed response or None on error)."""
        try:
            raw = self.export(body, timeout=timeout, compression=compression)
        except grpc.RpcError as err:
            return err.code(), err.details() or "", None  # type: ignore[attr-defined]
        resp = ExportTraceServiceResponse()
        resp.ParseFromString(raw)
        return grpc.StatusCode.OK, "", resp

    def close(self) -> None:
        self.channel.close()


# --------------------------------------------------------------------------- metrics

Samples = list[tuple[str, dict[str, str], float]]


def scrape(metrics_address: str, timeout: float = 10.0) -> Samples:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples]


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(v for n, lab, v in samples
               if n == name and all(lab.get(k) == want for k, want in labels.items()))


def wait_for(metrics_address: str, predicate: object, timeout: float = 20.0,
             what: str = "condition") -> Samples:
    """Scrape until ``predicate(samples)`` is true; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    samples: Samples = []
    while time.monotonic() < deadline:
        samples = scrape(metrics_address)
        if predicate(samples):  # type: ignore[operator]
            return samples
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
