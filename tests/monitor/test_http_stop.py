"""A graceful stop of the hardened HTTP server: requests after it are refused (503,
``Retry-After: 1``, ``Connection: close``, never dispatched), idle keep-alive connections
are closed at once, a request under way finishes, and a hung client cannot hold it."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from assaywatch.monitor.receivers.otlp.http_receiver import HttpReceiver
from assaywatch.monitor.receivers.otlp.http_server import (
    DeadlineRequestHandler,
    HardenedHTTPServer,
)
from assaywatch.monitor.receivers.spans import IngestCounters
from tests.monitor.sdkspans import RecordingSink, sdk_spans


class _Echo(DeadlineRequestHandler):
    """Records every body it is handed and answers 200 ``ok``."""

    bodies: list[bytes]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.bodies.append(body)
        try:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        except OSError:  # shut down by server_close after its grace
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def served() -> Iterator[tuple[HardenedHTTPServer, list[bytes]]]:
    bodies: list[bytes] = []
    handler = type("Echo", (_Echo,), {"bodies": bodies})
    server = HardenedHTTPServer(("127.0.0.1", 0), handler, stop_grace_s=3.0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield server, bodies
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _port(server: HardenedHTTPServer) -> int:
    return int(server.server_address[1])


def _wait_idle(server: HardenedHTTPServer, n: int) -> None:
    """Wait until ``n`` connections wait for a request (their handler read the last one)."""
    deadline = time.monotonic() + 5
    while sum(server._conns.values()) < n:
        assert time.monotonic() < deadline, "the connections never became idle"
        time.sleep(0.01)


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    """True when the peer closes ``sock`` (end of file or reset) within ``within`` s."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _second_request_is_refused(conn: http.client.HTTPConnection) -> None:
    """A request after the stop: 503 + Retry-After + Connection: close, or a closed
    connection; never a 200."""
    try:
        conn.request("POST", "/x", body=b"second")
        resp = conn.getresponse()
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        return
    resp.read()
    assert resp.status == 503
    assert resp.getheader("Retry-After") == "1"
    assert resp.getheader("Connection") == "close"


def test_a_request_on_a_keep_alive_connection_after_the_stop_is_not_served(served) -> None:
    server, bodies = served
    conn = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=5)
    conn.request("POST", "/x", body=b"first")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b"ok" and not resp.will_close
    _wait_idle(server, 1)  # the handler waits for the next request
    server.begin_stop()
    _second_request_is_refused(conn)
    conn.close()
    assert bodies == [b"first"]
    assert server.closed_idle == 1


def test_an_idle_keep_alive_connection_is_closed_within_a_second_of_the_stop(served) -> None:
    server, _ = served
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=5)
    sock.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi")
    answer = b""
    while not answer.endswith(b"ok"):
        answer += sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200")
    never_used = socket.create_connection(("127.0.0.1", _port(server)), timeout=5)
    _wait_idle(server, 2)  # both wait for a request
    started = time.monotonic()
    server.begin_stop()
    assert _closed_by_peer(sock, within=1.0)
    assert _closed_by_peer(never_used, within=1.0 - (time.monotonic() - started))
    assert time.monotonic() - started < 1.0
    sock.close()
    never_used.close()


def test_a_connection_opened_after_the_stop_gets_503_and_its_body_is_not_read(served) -> None:
    server, bodies = served
    server.begin_stop()  # the listener still accepts until shutdown()
    conn = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=5)
    conn.request("POST", "/x", body=b"late")
    resp = conn.getresponse()
    assert resp.status == 503 and resp.read() == b"server stopping; retry.\r\n"
    assert resp.getheader("Retry-After") == "1"
    assert resp.getheader("Connection") == "close"
    conn.close()
    assert bodies == [] and server.refused_stopping == 1


def test_a_body_being_uploaded_when_the_stop_begins_is_served_then_closed(served) -> None:
    server, bodies = served
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=5)
    sock.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nhalf-")
    time.sleep(0.2)  # the handler is reading the body
    server.begin_stop()
    time.sleep(0.2)
    sock.sendall(b"done!")
    answer = b""
    sock.settimeout(5)
    while chunk := sock.recv(4096):  # read to the end: the server closes
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body == b"ok"
    assert b"\r\nConnection: close" in head
    assert bodies == [b"half-done!"]
    sock.close()


def test_server_close_does_not_wait_for_a_hung_client() -> None:
    handler = type("Echo", (_Echo,), {"bodies": []})
    server = HardenedHTTPServer(("127.0.0.1", 0), handler, stop_grace_s=0.5)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    hung = socket.create_connection(("127.0.0.1", _port(server)), timeout=5)
    hung.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\nstart")
    time.sleep(0.2)  # under way: begin_stop leaves it be
    started = time.monotonic()
    server.shutdown()
    server.server_close()
    assert time.monotonic() - started < 2.0
    assert _closed_by_peer(hung, within=1.0)
    hung.close()
    thread.join(timeout=5)


def test_the_otlp_receiver_acknowledges_nothing_after_begin_stop() -> None:
    sink, counters = RecordingSink("otlp_http"), IngestCounters()
    rec = HttpReceiver(sink, counters, port=0, retry_after_s=0)
    port = rec.start()
    try:
        spans = sdk_spans(2)
        body = encode_spans(spans).SerializeToString()
        headers = {"Content-Type": "application/x-protobuf"}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/v1/traces", body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        accepted = len(sink.spans)
        assert accepted == len(spans) and counters.received["otlp_http"] == accepted
        rec.begin_stop()
        try:
            conn.request("POST", "/v1/traces", body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 503 and resp.getheader("Connection") == "close"
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            pass
        conn.close()
        late = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        late.request("POST", "/v1/traces", body=body, headers=headers)
        resp = late.getresponse()
        resp.read()
        assert resp.status == 503 and resp.getheader("Retry-After") == "1"
        late.close()
        assert len(sink.spans) == accepted and counters.received["otlp_http"] == accepted
    finally:
        started = time.monotonic()
        rec.stop()
        assert time.monotonic() - started < 3.0
