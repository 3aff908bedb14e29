"""OTLP/HTTP body handling: bounded reading, streaming inflation, response encoding.

Inflation is incremental with a bounded output step (``zlib`` ``max_length``), so a
compression bomb (1 GiB of zeros is ~1 MB of gzip) is stopped once the inflated size
passes the cap: memory never holds more than ``max_decompressed_bytes`` plus one step.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

PROTOBUF = "application/x-protobuf"
#: Largest inflation step: bounds how far past the cap the buffer can grow.
_STEP = 1024 * 1024
_GRPC_CODE = {
    400: code_pb2.INVALID_ARGUMENT,
    404: code_pb2.NOT_FOUND,
    405: code_pb2.UNIMPLEMENTED,
    408: code_pb2.DEADLINE_EXCEEDED,
    411: code_pb2.INVALID_ARGUMENT,
    413: code_pb2.RESOURCE_EXHAUSTED,
    415: code_pb2.INVALID_ARGUMENT,
    500: code_pb2.INTERNAL,
    503: code_pb2.UNAVAILABLE,
}


class ByteStream(Protocol):
    """What the body is read from: a socket file, ``io.BytesIO``, a WSGI input, ..."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readline(self, size: int = -1, /) -> bytes: ...


@dataclass(slots=True)
class HttpAnswer:
    """What to send back: status, content type, body, extra headers."""

    status: int
    content_type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    #: Close the connection after answering (the request body was not fully read).
    close: bool = False


class BodyError(Exception):
    """The body cannot be read or inflated; carries the HTTP answer to give."""

    def __init__(self, status: int, reason: str, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.close = close


class ByteBudget:
    """Bytes of request bodies a receiver holds at once, taken as they arrive.

    A body is read in pieces of at most :data:`_PIECE` bytes and each piece is taken from
    the budget before it is read, so a client that drips its body slowly holds only what
    it sent, and many fast large uploads at once are refused (503) instead of buffered.
    """

    def __init__(self, total: int) -> None:
        if total <= 0:
            raise ValueError(f"ByteBudget total must be > 0, got {total}")
        self.total = total
        self.free = total
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if n > self.free:
                return False
            self.free -= n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.free = min(self.total, self.free + n)


#: Largest piece of a body read (and taken from the budget) at once.
_PIECE = 1024 * 1024


class Reservation:
    """What one request took from a :class:`ByteBudget` (given back by ``release``); a
    reservation of no budget takes nothing."""

    def __init__(self, budget: ByteBudget | None) -> None:
        self.budget = budget
        self.n = 0

    def take(self, n: int) -> None:
        if self.budget is None:
            return
        if not self.budget.take(n):
            raise BodyError(503, "receiver_busy", "assaywatch is receiving too many request "
                            "bodies at once; retry later", close=True)
        self.n += n

    def release(self) -> None:
        if self.budget is not None and self.n:
            self.budget.give(self.n)
            self.n = 0


def _read_exact(stream: ByteStream, n: int, taken: Reservation | None = None) -> bytes:
    if taken is None or n <= _PIECE:
        if taken is not None:
            taken.take(n)
        data = stream.read(n)
    else:
        parts = bytearray()
        while len(parts) < n:
            piece = min(_PIECE, n - len(parts))
            taken.take(piece)
            got = stream.read(piece)
            parts += got
            if len(got) != piece:
                break
        data = bytes(parts)
    if len(data) != n:
        raise BodyError(
            400, "truncated_body", f"body ended after {len(data)} of {n} bytes", close=True
        )
    return data


def _read_chunked(stream: ByteStream, cap: int, taken: Reservation | None = None) -> bytes:
    out = bytearray()
    while True:
        line = stream.readline(1026)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BodyError(400, "malformed_chunked", "invalid chunk size line", True) from None
        if size == 0:
            while stream.readline(1026) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return bytes(out)
        if len(out) + size > cap:
            raise BodyError(413, "body_too_large", f"chunked body exceeds {cap} bytes", True)
        out += _read_exact(stream, size, taken)
        _read_exact(stream, 2)  # CRLF after the chunk


def _inflate(data: bytes, wbits: int, cap: int, what: str) -> bytearray:
    out = bytearray()
    d = zlib.decompressobj(wbits)
    buf = data
    try:
        while True:
            chunk = d.decompress(buf, min(_STEP, cap + 1 - len(out)))
            out += chunk
            if len(out) > cap:
                raise BodyError(
                    413,
                    "decompressed_too_large",
                    f"{what} body inflates to more than {cap} bytes; send smaller batches",
                )
            if d.eof:
                rest = d.unused_data
                if rest[:2] == b"\x1f\x8b" and wbits > 16:  # another gzip member
                    d, buf = zlib.decompressobj(wbits), rest
                    continue
                if rest.strip(b"\x00"):
                    raise BodyError(400, f"malformed_{what}", f"trailing data after {what} stream")
                return out  # no bytes() copy: up to 64 MiB
            buf = d.unconsumed_tail
            if not buf and not chunk:
                raise BodyError(400, f"malformed_{what}", f"{what} stream is truncated")
    except zlib.error as exc:
        raise BodyError(400, f"malformed_{what}", f"invalid {what} data: {exc}") from None


def inflate(data: bytes, encoding: str, cap: int) -> bytes | bytearray:
    """Undo ``Content-Encoding`` with an inflated-size cap (413 past it)."""
    if encoding in ("", "identity"):
        if len(data) > cap:
            raise BodyError(413, "body_too_large", f"body exceeds {cap} bytes")
        return data
    if encoding in ("gzip", "x-gzip"):
        return _inflate(data, 16 + zlib.MAX_WBITS, cap, "gzip")
    if encoding == "deflate":
        # RFC 9110 "deflate" is zlib-wrapped; some clients send raw deflate: sniff it.
        wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0
        return _inflate(data, zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS, cap, "deflate")
    raise BodyError(
        415, "unsupported_encoding", f"unsupported Content-Encoding {encoding!r}; use gzip"
    )


def read_body(
    stream: ByteStream,
    headers: Mapping[str, str],
    max_body_bytes: int,
    max_decompressed_bytes: int,
    budget: ByteBudget | None = None,
) -> bytes | bytearray:
    """Read (Content-Length or chunked) and inflate a request body within the caps
    (the wire bytes held meanwhile taken from ``budget``: 503 when it is spent)."""
    taken = Reservation(budget)
    try:
        raw = read_raw_body(stream, headers, max_body_bytes, taken)
        return inflate(raw, headers.get("content-encoding", "").strip().lower(),
                       max_decompressed_bytes)
    finally:
        taken.release()


def read_raw_body(
    stream: ByteStream,
    headers: Mapping[str, str],
    max_body_bytes: int,
    taken: Reservation | None = None,
) -> bytes:
    """Read the body as sent (not inflated), each piece taken from ``taken``'s budget
    before it is read; the caller gives the bytes back (``taken.release()``) once it has
    done with the body."""
    encoding = headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
        raise BodyError(
            415,
            "unsupported_encoding",
            f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or identity",
            close=True,
        )
    try:
        return _read_raw(stream, headers, max_body_bytes, taken or Reservation(None))
    except TimeoutError:  # the socket's idle timeout or the request deadline
        raise BodyError(408, "body_timeout", "the request body did not arrive in time",
                        close=True) from None
    except OSError as exc:
        raise BodyError(400, "truncated_body", f"reading the body failed: {exc}",
                        close=True) from None


def _read_raw(stream: ByteStream, headers: Mapping[str, str], max_body_bytes: int,
              taken: Reservation) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _read_chunked(stream, max_body_bytes, taken)
    else:
        length_text = headers.get("content-length", "0").strip() or "0"
        try:
            if not length_text.isdigit():  # no sign, no spaces, no "1_000"
                raise ValueError(length_text)
            length = int(length_text)
        except ValueError:
            raise BodyError(
                400, "bad_content_length", f"invalid Content-Length {length_text!r}", True
            ) from None
        if length < 0:
            raise BodyError(400, "bad_content_length", f"negative Content-Length {length}", True)
        if length > max_body_bytes:
            raise BodyError(
                413,
                "body_too_large",
                f"body of {length} bytes exceeds the {max_body_bytes}-byte limit; "
                "send smaller batches (BatchSpanProcessor max_export_batch_size)",
                close=True,
            )
        return _read_exact(stream, length, taken)


def status_body(
    content_type: str, http_status: int, message: str, reason: str, retry_s: int = 1
) -> bytes:
    """A ``google.rpc.Status`` body (BadRequest details for 400, RetryInfo for 503)."""
    code = _GRPC_CODE.get(http_status, code_pb2.UNKNOWN)
    if content_type == PROTOBUF:
        st = status_pb2.Status(code=code, message=message)
        if http_status == 400:
            detail = error_details_pb2.BadRequest()
            detail.field_violations.add(field="body", description=f"{reason}: {message}")
            st.details.add().Pack(detail)
        elif http_status == 503:
            st.details.add().Pack(
                error_details_pb2.RetryInfo(retry_delay=Duration(seconds=retry_s))
            )
        encoded: bytes = st.SerializeToString()
        return encoded
    doc: dict[str, object] = {"code": code, "message": message}
    if http_status == 400:
        doc["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": "body", "description": f"{reason}: {message}"}],
            }
        ]
    return json.dumps(doc).encode()


def response_body(content_type: str, rejected: int, message: str, logs: bool = False) -> bytes:
    """``ExportTraceServiceResponse`` (``ExportLogsServiceResponse`` when ``logs``, with
    ``rejected_log_records``); ``partial_success`` only when something was refused."""
    if content_type == PROTOBUF:
        resp = ExportLogsServiceResponse() if logs else ExportTraceServiceResponse()
        if rejected or message:
            if isinstance(resp, ExportLogsServiceResponse):
                resp.partial_success.rejected_log_records = rejected
            else:
                resp.partial_success.rejected_spans = rejected
            resp.partial_success.error_message = message
        data: bytes = resp.SerializeToString()
        return data
    if not (rejected or message):
        return b"{}"
    key = "rejectedLogRecords" if logs else "rejectedSpans"
    partial = {key: str(rejected), "errorMessage": message}
    return json.dumps({"partialSuccess": partial}).encode()
