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
* **Stopping is graceful** (:meth:`HardenedHTTPServer.begin_stop`, also the first step of
  ``server_close``): from then on a request that starts arriving on any connection
  (keep-alive or newly accepted) is answered ``503`` with ``Retry-After: 1`` and
  ``Connection: close`` once its headers are in, and its body is never handed to the
  application; idle keep-alive connections are shut down at once (the client sees the
  connection closed, never an answer); a request under way (its first byte arrived
  before the stop) finishes, is answered with ``Connection: close``, and its connection
  closes. ``server_close`` waits at most ``stop_grace_s`` (5 s) for the requests under
  way, then shuts their sockets down: a hung client cannot hold the stop.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["DeadlineRequestHandler", "HardenedHTTPServer", "RequestDeadline"]

logger = logging.getLogger(__name__)

#: Default cap on connections served at once, per server.
DEFAULT_MAX_CONNECTIONS = 64
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
         b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 30\r\n\r\n"
         b"too many connections; retry.\r\n")
_STOPPING_BODY = b"server stopping; retry.\r\n"


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
    """A request handler whose requests must arrive within ``request_deadline_s``, and
    which refuses requests once its :class:`HardenedHTTPServer` is stopping."""

    protocol_version = "HTTP/1.1"
    #: TCP_NODELAY: an answer is written as headers then body, and with Nagle's algorithm
    #: the body waited for the client's delayed ACK, ~40 ms per keep-alive answer
    disable_nagle_algorithm = True
    #: Seconds of silence after which a socket read fails.
    timeout = 30.0
    #: Seconds a whole request (line, headers, body) may take to arrive.
    request_deadline_s = 60.0
    #: Seconds the request line and headers on a connection accepted after the stop began
    #: may take to arrive (they are answered 503).
    stopping_deadline_s = 2.0
    _raw_in: _DeadlineSocketIO
    #: this request started arriving after the stop began: answer 503, never dispatch it
    _stopping_refusal = False
    #: an interim answer (100 Continue) is being written
    _interim_answer = False
    #: requests begun on this connection
    _requests_begun = 0

    def setup(self) -> None:
        super().setup()
        self._raw_in = _DeadlineSocketIO(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._raw_in, 64 * 1024)

    def handle_one_request(self) -> None:
        now = time.monotonic()
        self._raw_in.deadline = now + self.request_deadline_s
        self._stopping_refusal = False
        server = self.server
        tracked = isinstance(server, HardenedHTTPServer)
        try:
            if tracked:
                if server._await_request(self.connection):
                    # idle (begin_stop shuts the socket down) until a first byte arrives
                    try:
                        arrived = self.rfile.peek(1)
                    except TimeoutError as exc:
                        self.log_error("Request timed out: %r", exc)
                        self.close_connection = True
                        return
                    if arrived:
                        self._stopping_refusal = not server._request_began(self.connection)
                elif self._requests_begun:  # kept alive as the stop began: close it
                    self.close_connection = True
                    return
                else:  # accepted after the stop began: read the head, answer 503
                    self._stopping_refusal = True
                    self._raw_in.deadline = min(self._raw_in.deadline,
                                                now + self.stopping_deadline_s)
            self._requests_begun += 1
            super().handle_one_request()
        finally:
            self._raw_in.deadline = None
            if tracked and server.stopping:
                self.close_connection = True

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self._stopping_refusal:
            self._answer_stopping()
            return False  # "an answer was sent": the body is neither read nor dispatched
        return True

    def handle_expect_100(self) -> bool:
        if self._stopping_refusal:
            return True  # no 100 Continue: parse_request answers 503
        self._interim_answer = True
        try:
            return super().handle_expect_100()
        finally:
            self._interim_answer = False

    def _say_closing(self) -> None:
        # an answer written once the stop began closes its connection, and says so
        if (not self._interim_answer and not self.close_connection
                and getattr(self.server, "stopping", False)):
            self.send_header("Connection", "close")

    def end_headers(self) -> None:
        self._say_closing()
        super().end_headers()

    def send_answer(self, code: int, body: bytes, ctype: str,
                    headers: Mapping[str, str] | None = None, close: bool = False) -> None:
        """A whole answer: status, ``Content-Type``, ``Content-Length``, ``headers``,
        ``Connection: close`` when ``close``, then the body, headers and body in one write
        (one system call, and one wait for the interpreter lock after it instead of two: a
        busy pipeline thread keeps the lock up to the switch interval, 5 ms, each time).
        A body over :data:`JOIN_MAX_BYTES` (a /metrics exposition) is written after the
        headers instead of being copied behind them. A client gone away is not an error:
        the connection is closed."""
        try:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            if self.request_version == "HTTP/0.9" or len(body) > JOIN_MAX_BYTES:
                self.end_headers()
                self.wfile.write(body)
                return
            self._say_closing()  # what end_headers does, then the blank line and the body
            self._headers_buffer.append(b"\r\n")  # type: ignore[attr-defined]
            self._headers_buffer.append(body)  # type: ignore[attr-defined]
            self.flush_headers()
        except OSError:  # the client went away (a scrape timeout): nothing to answer
            self.close_connection = True

    def _answer_stopping(self) -> None:
        server = self.server
        if isinstance(server, HardenedHTTPServer):
            server._count_refused()
        self.close_connection = True
        try:
            self.send_response(503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Retry-After", "1")
            self.send_header("Connection", "close")
            self.send_header("Content-Length", str(len(_STOPPING_BODY)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(_STOPPING_BODY)
        except OSError:  # the client went away (or the stop's grace ran out)
            pass


#: Largest answer body sent in the same write as the headers.
JOIN_MAX_BYTES = 64 * 1024


class HardenedHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with a connection cap, a 128 backlog, lingering close and a
    graceful stop (:meth:`begin_stop`; ``server_close`` waits at most ``stop_grace_s``)."""

    daemon_threads = True
    #: server_close waits for the connections itself, at most ``stop_grace_s``
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, linger_s: float = 2.0,
                 stop_grace_s: float = 5.0) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self._slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        self.linger_s = linger_s
        self.stop_grace_s = stop_grace_s
        self.refused_connections = 0
        #: requests answered 503 because the server was stopping
        self.refused_stopping = 0
        #: idle keep-alive connections shut down by begin_stop
        self.closed_idle = 0
        #: guards the connection table, the stop flag and the count of handler threads
        self._conn_lock = threading.Condition()
        #: open connection socket -> True while it waits for a request (idle)
        self._conns: dict[socket.socket, bool] = {}
        self._handlers = 0
        self._stopping = False
        super().__init__(address, handler)

    @property
    def stopping(self) -> bool:
        """True once :meth:`begin_stop` (or ``server_close``) was called."""
        return self._stopping

    def begin_stop(self) -> None:
        """The first step of a graceful stop (idempotent, never blocks): every request
        that starts arriving from now on is answered 503 (``Retry-After: 1``,
        ``Connection: close``) without reaching the application; idle keep-alive
        connections are shut down now; requests under way finish and their connections
        then close. Call it before the application stops accepting data; ``shutdown``
        (stop accepting connections) and ``server_close`` follow."""
        with self._conn_lock:
            if self._stopping:
                return
            self._stopping = True
            idle = [sock for sock, waiting in self._conns.items() if waiting]
            for sock in idle:  # under the lock: no handler closes it meanwhile
                _shut(sock)
            self.closed_idle += len(idle)
            busy = len(self._conns) - len(idle)
        logger.info("HTTP server on %s stopping: %d idle connection(s) closed, %d "
                    "request(s) under way", self.server_address, len(idle), busy)

    def server_close(self) -> None:
        """Stop (:meth:`begin_stop`), close the listening socket, wait at most
        ``stop_grace_s`` for the requests under way, then shut down what is still open."""
        self.begin_stop()
        super().server_close()
        deadline = time.monotonic() + self.stop_grace_s
        with self._conn_lock:
            while self._handlers > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._conn_lock.wait(left)
            stuck = list(self._conns)
            for sock in stuck:
                _shut(sock)
        if stuck:
            logger.warning("HTTP server on %s: %d connection(s) still open %.1f s after "
                           "the stop began were shut down", self.server_address,
                           len(stuck), self.stop_grace_s)

    # -- the connection table (called by DeadlineRequestHandler) ------------------------
    def _await_request(self, sock: socket.socket) -> bool:
        """The connection waits for its next request (idle); False once stopping."""
        with self._conn_lock:
            if self._stopping:
                return False
            self._conns[sock] = True
            return True

    def _request_began(self, sock: socket.socket) -> bool:
        """A request's first byte arrived (busy); False if the stop began first."""
        with self._conn_lock:
            if sock in self._conns:
                self._conns[sock] = False
            return not self._stopping

    def _count_refused(self) -> None:
        with self._conn_lock:
            self.refused_stopping += 1

    # -- socketserver --------------------------------------------------------------------
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
        with self._conn_lock:
            self._conns[request] = True  # idle until its handler reads a request
            self._handlers += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._handler_done()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
            self._handler_done()

    def _handler_done(self) -> None:
        with self._conn_lock:
            self._handlers -= 1
            self._conn_lock.notify_all()

    def shutdown_request(self, request: Any, linger: bool = True) -> None:
        with self._conn_lock:  # out of the table before it is closed
            self._conns.pop(request, None)
        try:
            request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        else:
            if linger and self.linger_s > 0:
                _drain(request, self.linger_s)
        self.close_request(request)


def _shut(sock: socket.socket) -> None:
    """Shut both directions down: a thread blocked reading it wakes with end of file."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


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
