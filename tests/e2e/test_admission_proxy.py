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
* nothing is answered otherwise than OK or a retryable refusal.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


class _SlowHttp(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(SLOW_S)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _slow_export(request: bytes, context: grpc.ServicerContext) -> bytes:
    time.sleep(SLOW_S)
    return b""


@pytest.fixture
def proxy() -> Iterator[AdmissionProxy]:
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
