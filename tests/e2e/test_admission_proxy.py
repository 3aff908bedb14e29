"""The shipped admission proxy's refusals, over both protocols (``deploy/admission``).

A real HAProxy with ``deploy/admission/haproxy.cfg``, unchanged, in front of a stand-in
for the monitor that takes 3 s to answer each request (a gRPC server and an HTTP server,
real ones, from this process). A slow monitor is what makes the proxy's queue fill; the
real monitor under a real flood is ``test_overload.py``. One sender (127.0.0.1) sends 70
requests at once: the proxy's rules say that

* 4 HTTP requests / 8 gRPC calls are at the monitor at once, the rest wait in the queue;
* after the sender's 50th request in 10 s it is a heavy sender, and while 8 or more
  requests wait, each further request of it is refused at the door: at once (well under
  the monitor's 3 s), HTTP 503 with ``Retry-After``, gRPC ``UNAVAILABLE`` with the
  ``google.rpc.RetryInfo`` the monitor itself sends (1 s);
* a request that waits 5 s in the queue is refused the same way;
* nothing is answered otherwise than OK or a retryable refusal;
* the real OTLP exporters of the OpenTelemetry SDK (HTTP and gRPC), sending from that
  heavy sender while the queue is full, are refused (the proxy counts more refusals than
  the flood received), retry as the hint says and deliver their batch once. (With the
  door rule disabled, the HTTP case fails: 62 refusals, all the flood's; the gRPC
  exporter is then refused after 5 s in the queue instead, which passes.)
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

from tests.e2e.rawotlp import EXPORT_METHOD
from tests.infra.haproxy import AdmissionProxy, haproxy_binary
from tests.infra.kafka import free_ports

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(haproxy_binary() is None, reason="the `haproxy` command is not "
                       "installed (CI installs Debian's haproxy package)"),
]

#: Seconds the stand-in monitor takes per request.
SLOW_S = 3.0
#: Requests the one sender sends at once.
BURST = 70
#: The configuration's numbers (deploy/admission/haproxy.cfg).
HEAVY_AFTER = 50
SLOTS = {"http": 4, "grpc": 8}
QUEUE_TIMEOUT_S = 5.0


#: User-Agent of every request that reached the stand-in monitor (both protocols).
ARRIVED: list[str] = []


class _SlowHttp(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ARRIVED.append(self.headers.get("User-Agent") or "")
        time.sleep(SLOW_S)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _slow_export(request: bytes, context: grpc.ServicerContext) -> bytes:
    ARRIVED.append(dict(context.invocation_metadata()).get("user-agent", ""))
    time.sleep(SLOW_S)
    return b""


@pytest.fixture
def proxy() -> Iterator[AdmissionProxy]:
    ARRIVED.clear()
    http_port, grpc_port = free_ports(2)
    http = ThreadingHTTPServer(("127.0.0.1", http_port), _SlowHttp)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    service, method = EXPORT_METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {
        method: grpc.unary_unary_rpc_method_handler(_slow_export)})])
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    server.start()
    with AdmissionProxy(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}") as p:
        yield p
    server.stop(0)
    http.shutdown()
    http.server_close()


def _http_post(address: str) -> tuple[int, str | None, float]:
    import http.client
    host, port = address.rsplit(":", 1)
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=b"\x00" * 1000,
                     headers={"Content-Type": "application/x-protobuf"})
        r = conn.getresponse()
        r.read()
        return r.status, r.getheader("Retry-After"), time.monotonic() - t0
    finally:
        conn.close()


def _grpc_call(channel: grpc.Channel) -> tuple[str, float | None, float]:
    export = channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                                 response_deserializer=None)
    t0 = time.monotonic()
    try:
        export(b"", timeout=30)
        return "OK", None, time.monotonic() - t0
    except grpc.RpcError as err:
        delay = None
        for m in err.trailing_metadata() or ():  # type: ignore[attr-defined]
            if m.key == "google.rpc.retryinfo-bin":
                info = error_details_pb2.RetryInfo.FromString(m.value)
                delay = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
        return err.code().name, delay, time.monotonic() - t0  # type: ignore[attr-defined]


def _burst(call: object, n: int) -> list[tuple[object, object, float]]:
    """``n`` calls started one after another (in order, 10 ms apart, so the proxy sees
    them in that order), all in flight together."""
    out: list[tuple[object, object, float]] = [("", None, 0.0)] * n
    threads = []
    for i in range(n):
        def run(i: int = i) -> None:
            out[i] = call()  # type: ignore[operator]
        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        time.sleep(0.01)
    for t in threads:
        t.join(timeout=60)
    return out


def _check(results: list[tuple[object, object, float]], ok: object, refused: object,
           hint: object, slots: int) -> None:
    codes = Counter(r[0] for r in results)
    assert set(codes) <= {ok, refused}, codes
    # the first `slots` are at the monitor at once: answered OK after its 3 s
    assert all(r[0] == ok for r in results[:slots]), results[:slots]
    # past the 50th request in 10 s, with 8 or more waiting: refused at once, with a hint
    late = results[HEAVY_AFTER + 1:]
    assert late and all(r[0] == refused and r[1] == hint and r[2] < 1.0 for r in late), late
    # nothing waits in the queue past its 5 s (+ the monitor's 3 s once dispatched)
    assert max(r[2] for r in results) < QUEUE_TIMEOUT_S + SLOW_S + 2.0
    # every queued request that did not reach the monitor in 5 s was refused with a hint
    assert all(r[1] == hint for r in results if r[0] == refused)


def test_http_flood_is_refused_at_the_door_with_retry_after(proxy: AdmissionProxy) -> None:
    results = _burst(lambda: _http_post(proxy.http), BURST)
    _check(results, 200, 503, "1", SLOTS["http"])


def test_grpc_flood_is_refused_at_the_door_with_retry_info(proxy: AdmissionProxy) -> None:
    channel = grpc.insecure_channel(proxy.grpc, options=[("grpc.enable_http_proxy", 0)])
    try:
        results = _burst(lambda: _grpc_call(channel), BURST)
    finally:
        channel.close()
    _check(results, "OK", "UNAVAILABLE", 1.0, SLOTS["grpc"])


def _sdk_spans() -> list[Any]:
    """Three finished spans of the real SDK (an in-memory exporter collects them)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("admission-test")
    with tracer.start_as_current_span("invoke_agent support"):
        for i in range(2):
            with tracer.start_as_current_span(f"chat {i}"):
                pass
    provider.shutdown()
    return list(memory.get_finished_spans())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_sdk_exporters_wait_out_a_refusal_and_deliver_once(proxy: AdmissionProxy,
                                                                protocol: str) -> None:
    from opentelemetry.sdk.trace.export import SpanExportResult

    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter: Any = OTLPSpanExporter(endpoint=f"http://{proxy.http}/v1/traces",
                                         timeout=30)
        flood: Any = lambda: _http_post(proxy.http)  # noqa: E731
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )
        exporter = GrpcExporter(endpoint=f"http://{proxy.grpc}", insecure=True, timeout=30)
        channel = grpc.insecure_channel(proxy.grpc, options=[("grpc.enable_http_proxy", 0)])
        flood = lambda: _grpc_call(channel)  # noqa: E731
    spans = _sdk_spans()
    # the same sender floods first: past its 50th request, with the queue full, it is heavy
    flooded: list[list[tuple[object, object, float]]] = []
    thread = threading.Thread(target=lambda: flooded.append(_burst(flood, BURST)))
    thread.start()
    time.sleep(0.01 * BURST + 0.3)  # every flood request sent (10 ms apart) and queued
    result = exporter.export(spans)
    thread.join(timeout=60)
    exporter.shutdown()
    if protocol == "grpc":
        channel.close()
    assert result is SpanExportResult.SUCCESS
    sdk = [ua for ua in ARRIVED if ua.startswith("OTel-OTLP-Exporter-Python")]
    # delivered exactly once, and only once it got through the door
    assert len(sdk) == 1, ARRIVED
    # the proxy refused more requests than the flood saw refused: the exporter's
    refused = proxy.answers_5xx(f"otlp_{protocol}")
    flood_refused = sum(r[0] in (503, "UNAVAILABLE") for r in flooded[0])
    assert refused > flood_refused, (refused, flood_refused)
