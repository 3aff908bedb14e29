"""A standard-library HTTP server hardened for untrusted clients (OTLP/HTTP and the
metrics port share it).

* **Connections are bounded**: at most ``max_connections`` are served at once (one thread
  each); one more gets ``503`` with ``Retry-After`` and is closed at once. The listen
  backlog is 128 (``request_queue_size``), not the standard library's 5.
* **Every request has a deadline**: from the moment the server waits for a request, its
  line, headers and body must arrive within ``request_deadline_s`` (60 s), however slowly
  they drip; each socket read also times out after ``timeout`` (30 s) of silence. A
  client that misses either is disconnected, so a slow-drip body cannot hold a thread.
* **Closing lingers**: when the server closes a connection (after a 413 on a body it did
  not read, for instance) it first half-closes and discards what the client still sends
  for up to ``linger_s`` (2 s), so the client reads the answer instead of a reset.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["DeadlineRequestHandler", "HardenedHTTPServer", "RequestDeadline"]

#: Default cap on connections served at once, per server.
DEFAULT_MAX_CONNECTIONS = 64
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
         b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 30\r\n\r\n"
         b"too many connections; retry.\r\n")


class RequestDeadline(TimeoutError):
    """The request did not arrive whole before its deadline."""


class _DeadlineSocketIO(io.RawIOBase):
    """The socket as a raw stream whose every read is bounded by a deadline, so a
    buffered ``readline``/``read`` (many ``recv`` calls) cannot outlive it."""

    def __init__(self, sock: socket.socket, idle_timeout: float | None) -> None:
        super().__init__()
        self.sock = sock
        self.idle_timeout = idle_timeout
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise RequestDeadline("the request did not arrive within its deadline")
            self.sock.settimeout(left if self.idle_timeout is None
                                 else min(left, self.idle_timeout))
            try:
                return self.sock.recv_into(b)
            finally:  # writes keep the idle timeout, not what was left of the deadline
                self.sock.settimeout(self.idle_timeout)
        return self.sock.recv_into(b)


class DeadlineRequestHandler(BaseHTTPRequestHandler):
    """A request handler whose requests must arrive within ``request_deadline_s``."""

    protocol_version = "HTTP/1.1"
    #: Seconds of silence after which a socket read fails.
    timeout = 30.0
    #: Seconds a whole request (line, headers, body) may take to arrive.
    request_deadline_s = 60.0
    _raw_in: _DeadlineSocketIO

    def setup(self) -> None:
        super().setup()
        self._raw_in = _DeadlineSocketIO(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._raw_in, 64 * 1024)

    def handle_one_request(self) -> None:
        self._raw_in.deadline = time.monotonic() + self.request_deadline_s
        try:
            super().handle_one_request()
        finally:
            self._raw_in.deadline = None


class HardenedHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with a connection cap, a 128 backlog and lingering close."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, linger_s: float = 2.0) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self._slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        self.linger_s = linger_s
        self.refused_connections = 0
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused_connections += 1
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request, linger=False)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def shutdown_request(self, request: Any, linger: bool = True) -> None:
        try:
            request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        else:
            if linger and self.linger_s > 0:
                _drain(request, self.linger_s)
        self.close_request(request)


def _drain(sock: socket.socket, seconds: float) -> None:
    """Discard what the peer still sends until it closes or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    buf = bytearray(64 * 1024)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(left)
            if not sock.recv_into(buf):
                return
    except OSError:
        return
