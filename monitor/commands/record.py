"""``assaywatch record``: receive OTLP traces and logs and append them to a span file.

The recorder runs the monitor's own receivers (``GrpcReceiver`` and ``HttpReceiver``, the
same OTLP answers: partial success for bad ids, 400 / INVALID_ARGUMENT for undecodable
requests, 413, 415, 503 / UNAVAILABLE when the file cannot be written) with a sink that
appends one OTLP JSON line per accepted request to ``--output``: exactly the format
``baseline build``, ``gate`` and ``replay`` read (``monitor/receivers/files``).

What the file holds
    The receivers hand their sink decoded :class:`SpanRecord`\\ s, not the request. The
    recorder decodes with no attribute or event limits (every attribute, event, resource
    attribute and value is kept whole; the request-size cap bounds memory) and writes
    the records back as OTLP/JSON: ids, names, kinds, times, status, attributes, events,
    resource and scope name. Not kept: span links, trace state, flags, dropped-counts,
    scope version and attributes, schema URLs. The decoder reads none of them
    (``decode.py``), so reading the file gives the spans the monitor would have seen,
    record for record (``tests/monitor/test_record.py`` checks the round trip).
    OTLP logs (gRPC LogsService, HTTP ``/v1/logs``): each ``gen_ai.evaluation.result``
    event becomes an evaluation record and a logs request's records one
    ``ExportLogsServiceRequest`` line (hex ids; its evaluation attributes only, never the
    explanation or the body); other log records are not written
    (``monitor/receivers/files/records_json.py``).

Writing
    Each request is encoded on its receiver thread, then written, flushed to the OS and
    counted under one lock, before the receiver answers: an acknowledged span is in the
    file. ``PATH`` ending in ``.gz`` is written as one gzip member per recorder session
    (sync-flushed after every request; appending to an existing file adds a member,
    which the readers handle). SIGTERM or SIGINT stops the receivers, finishes the
    member and closes the file. ``--rotate-bytes N`` moves a file that reached N bytes to
    ``PATH.1`` (older ones shift to ``PATH.2``, ...), logrotate style; a request's line
    is never split.

Exit codes: 0 after SIGTERM/SIGINT, 3 for a port in use, a bad address, or a file that
cannot be opened or written (one-line message, never a traceback).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterable
from typing import IO, Any

from assaywatch.monitor.receivers.spans import KIND_EVALUATION  # light: the standard library

__all__ = ["SpanFileWriter", "records_to_json", "register", "run"]

ENV_GRPC = "ASSAYWATCH_OTLP_GRPC"
ENV_HTTP = "ASSAYWATCH_OTLP_HTTP"
DEFAULT_GRPC = "127.0.0.1:4317"
DEFAULT_HTTP = "127.0.0.1:4318"
#: Largest OTLP request accepted (gRPC message, HTTP body on the wire), as the monitor's.
MAX_REQUEST_BYTES = 8 * 1024 * 1024


def register(sub: Any) -> None:
    p = sub.add_parser(
        "record",
        help="receive OTLP traces and logs and append them to a span file (for baseline "
             "build, gate)",
        description=(
            "Receive OTLP traces (gRPC TraceService and HTTP /v1/traces) and logs (gRPC "
            "LogsService and HTTP /v1/logs), protobuf or JSON, gzip or deflate, with the "
            "monitor's receivers and append them to PATH as OTLP JSON Lines, one request "
            "per line: the span file `assaywatch baseline build` and `assaywatch gate` "
            "read. Of the logs, the gen_ai.evaluation.result events are written (their "
            "evaluation name, score, label and pass flag; never the explanation or the "
            "body); other log records are accepted and not written. PATH ending in .gz is "
            "gzip-compressed. Binds loopback by default; a port of 0 picks a free port "
            "(the bound addresses are printed). Runs until SIGTERM or SIGINT, then "
            "flushes, closes the file and prints 'wrote N spans (M traces) to PATH' "
            "(and how many evaluations). Exit 0 then; 3 for a port in use or a file that "
            "cannot be written."),
    )
    p.add_argument("-o", "--output", required=True, metavar="PATH",
                   help="span file to append to (created if missing; gzip when it ends in .gz)")
    p.add_argument("--otlp-grpc", metavar="HOST:PORT", default=None,
                   help=f"OTLP/gRPC listen address (env {ENV_GRPC}; default "
                        f"{DEFAULT_GRPC}; '' disables)")
    p.add_argument("--otlp-http", metavar="HOST:PORT", default=None,
                   help=f"OTLP/HTTP listen address (env {ENV_HTTP}; default "
                        f"{DEFAULT_HTTP}; '' disables)")
    p.add_argument("--rotate-bytes", metavar="N", type=int, default=None,
                   help="rotate PATH once it holds N bytes: it becomes PATH.1, older files "
                        "shift to PATH.2, ... (default: never)")
    p.set_defaults(func=run)


# --------------------------------------------------------------------------- the file


class SpanFileWriter:
    """Appends OTLP JSON lines to a file, thread-safe; gzip for ``.gz``; size rotation.

    Parameters
    ----------
    path:
        The file. Created (with its folder) if missing, appended to otherwise (a plain
        file that does not end in a newline, e.g. after a crash mid-line, gets one first).
    rotate_bytes:
        When the file holds at least this many bytes (compressed size for gzip), the next
        write first renames it to ``path.1`` (``path.1`` to ``path.2``, ...). None: never.
    """

    def __init__(self, path: str, rotate_bytes: int | None = None) -> None:
        if rotate_bytes is not None and rotate_bytes <= 0:
            raise ValueError(f"rotate_bytes must be > 0, got {rotate_bytes}")
        self.path = path
        self.rotate_bytes = rotate_bytes
        self.gzip = path.endswith(".gz")
        self.spans = 0
        #: Evaluation records written (``gen_ai.evaluation.result`` log records).
        self.evaluations = 0
        self.rotations = 0
        self._traces: set[str] = set()
        self._lock = threading.Lock()
        self._raw: IO[bytes] | None = None
        self._gz: gzip.GzipFile | None = None
        self._size = 0
        self.closed = False

    @property
    def traces(self) -> int:
        return len(self._traces)

    def open(self) -> None:
        """Open (or create) the file; OSError when it cannot be."""
        with self._lock:
            self._open()

    def _open(self) -> None:
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        raw = open(self.path, "ab")  # noqa: SIM115 - closed in _close_file
        try:
            self._size = raw.tell()
            if self._size and not self.gzip:
                with open(self.path, "rb") as fh:
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        raw.write(b"\n")
                        raw.flush()
                        self._size += 1
        except OSError:
            raw.close()
            raise
        self._raw = raw
        self._gz = None  # a gzip member starts with the first line written

    def _close_file(self) -> None:
        raw, gz = self._raw, self._gz
        self._raw = self._gz = None
        try:
            if gz is not None:
                gz.close()  # the member's trailer; leaves raw open
        finally:
            if raw is not None:
                raw.close()

    def _rotate(self) -> None:
        self._close_file()
        n = 1
        while os.path.exists(f"{self.path}.{n}"):
            n += 1
        for k in range(n, 1, -1):
            os.replace(f"{self.path}.{k - 1}", f"{self.path}.{k}")
        os.replace(self.path, f"{self.path}.1")
        self.rotations += 1
        self._open()

    def write(self, line: bytes, spans: int, trace_ids: Iterable[str],
              evaluations: int = 0) -> bool:
        """Append one line (ending in ``\\n``) and flush it; False once closed.
        ``spans`` and ``trace_ids`` (of the spans) or ``evaluations`` are counted.

        Raises OSError when the file cannot be written (the caller stops recording).
        """
        with self._lock:
            if self.closed or self._raw is None:
                return False
            if self.rotate_bytes is not None and self._size >= self.rotate_bytes:
                self._rotate()
            raw = self._raw
            assert raw is not None
            if self.gzip:
                if self._gz is None:
                    self._gz = gzip.GzipFile(filename="", mode="ab", fileobj=raw, mtime=0)
                self._gz.write(line)
                self._gz.flush()  # zlib sync flush + raw.flush(): readable so far
            else:
                raw.write(line)
                raw.flush()
            self._size = raw.tell()
            self.spans += spans
            self.evaluations += evaluations
            self._traces.update(trace_ids)
            return True

    def close(self) -> None:
        """Finish the gzip member (if any) and close; later writes return False."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._close_file()


class RecordSink:
    """The receivers' :class:`SpanSink`: every request becomes one line of the file (an
    ``ExportTraceServiceRequest`` of its spans, or an ``ExportLogsServiceRequest`` of its
    evaluation records; a batch holding both, which the receivers never hand over,
    would become two lines).

    A write error is remembered in :attr:`error` (the request is refused, so the exporter
    keeps its spans and retries) and sets :attr:`failed`, which stops the recorder.
    """

    def __init__(self, writer: SpanFileWriter) -> None:
        self.writer = writer
        self.error: OSError | None = None
        self.failed = threading.Event()

    def offer(self, spans: list[Any], receiver: str) -> bool:
        from assaywatch.monitor.receivers.files.records_json import evaluations_to_json

        if self.error is not None:
            return False
        evaluations = [s for s in spans if s.kind == KIND_EVALUATION]
        if evaluations:
            spans = [s for s in spans if s.kind != KIND_EVALUATION]
        try:
            if spans and not self.writer.write(_line(records_to_json(spans)), len(spans),
                                               (s.trace_id for s in spans)):
                return False
            if evaluations:
                return self.writer.write(_line(evaluations_to_json(evaluations)), 0, (),
                                         len(evaluations))
            return True
        except OSError as exc:
            if self.error is None:
                self.error = exc
            self.failed.set()
            return False


def records_to_json(spans: Iterable[Any]) -> dict[str, Any]:
    """``SpanRecord``\\ s as one OTLP/JSON ``ExportTraceServiceRequest`` (hex ids); see
    :func:`~assaywatch.monitor.receivers.files.records_json.records_to_json`."""
    from assaywatch.monitor.receivers.files.records_json import records_to_json as render

    return render(spans)


def _line(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


# --------------------------------------------------------------------------- command


def _address(flag: str | None, env: str, default: str) -> str:
    if flag is not None:
        return flag
    return os.environ.get(env, default)


def _check_free(host: str, port: int, listener: str, flag: str) -> None:
    """Refuse an address another process listens on, before the receiver binds.

    gRPC binds with SO_REUSEPORT, so a second gRPC server on the same port would bind
    silently and share the traffic: a plain bind (SO_REUSEADDR only) tells the truth.
    """
    from assaywatch.monitor.commands.errors import UsageError

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise UsageError(f"{listener} listener cannot bind {host}:{port}: {exc}; "
                         f"choose another address with {flag} HOST:PORT") from None
    for family, socktype, proto, _, sockaddr in infos[:1]:
        with socket.socket(family, socktype, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(sockaddr)
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise UsageError(f"{listener} listener cannot bind {host}:{port}: "
                                 f"{reason.lower()}; choose another port with "
                                 f"{flag} HOST:PORT") from None


def run(args: argparse.Namespace) -> int:
    from assaywatch.monitor.commands.errors import UsageError
    from assaywatch.monitor.config import ConfigError, parse_hostport
    from assaywatch.monitor.receivers.otlp.decode import DecodeLimits
    from assaywatch.monitor.receivers.otlp.grpc_receiver import GrpcReceiver
    from assaywatch.monitor.receivers.otlp.http_receiver import HttpReceiver
    from assaywatch.monitor.receivers.spans import IngestCounters

    if args.rotate_bytes is not None and args.rotate_bytes <= 0:
        raise UsageError(f"--rotate-bytes must be > 0, got {args.rotate_bytes}")
    grpc_addr = _address(args.otlp_grpc, ENV_GRPC, DEFAULT_GRPC)
    http_addr = _address(args.otlp_http, ENV_HTTP, DEFAULT_HTTP)
    if not grpc_addr and not http_addr:
        raise UsageError("both listeners are disabled; give --otlp-grpc or --otlp-http")
    try:
        grpc_hp = parse_hostport(grpc_addr, "--otlp-grpc") if grpc_addr else None
        http_hp = parse_hostport(http_addr, "--otlp-http") if http_addr else None
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if grpc_hp:
        _check_free(grpc_hp[0], grpc_hp[1], "OTLP/gRPC", "--otlp-grpc")
    if http_hp:
        _check_free(http_hp[0], http_hp[1], "OTLP/HTTP", "--otlp-http")

    writer = SpanFileWriter(args.output, args.rotate_bytes)
    try:
        writer.open()
    except OSError as exc:
        raise UsageError(f"cannot open {args.output} for writing: "
                         f"{exc.strerror or exc}") from None
    sink = RecordSink(writer)
    counters = IngestCounters()
    # No attribute or event caps: the file keeps what was sent (the request cap bounds it).
    limits = DecodeLimits(max_value_bytes=MAX_REQUEST_BYTES * 8,
                          max_attributes=2**31 - 1, max_events=2**31 - 1)
    servers: list[Any] = []
    addresses: list[str] = []
    try:
        if grpc_hp:
            g = GrpcReceiver(sink, counters, host=grpc_hp[0], port=grpc_hp[1],
                             max_message_bytes=MAX_REQUEST_BYTES, limits=limits)
            addresses.append(f"otlp_grpc={grpc_hp[0]}:{g.start()}")
            servers.append(g)
        if http_hp:
            h = HttpReceiver(sink, counters, host=http_hp[0], port=http_hp[1],
                             max_body_bytes=MAX_REQUEST_BYTES, limits=limits)
            addresses.append(f"otlp_http={http_hp[0]}:{h.start()}")
            servers.append(h)
    except OSError as exc:
        for server in servers:
            server.stop()
        writer.close()
        raise UsageError(str(exc).splitlines()[0]) from None

    print(f"assaywatch record listening {' '.join(addresses)}; appending to {args.output}",
          flush=True)
    done = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    def _on_failure() -> None:
        sink.failed.wait()
        done.set()

    threading.Thread(target=_on_failure, daemon=True, name="record-failure").start()
    while not done.wait(1.0):
        pass
    for server in servers:  # in-flight requests finish (and are written) first
        server.stop()
    close_error: OSError | None = None
    try:
        writer.close()
    except OSError as exc:
        close_error = exc
    error = sink.error or close_error
    if error is not None:
        print(f"assaywatch: error: cannot write {args.output}: {error.strerror or error}; "
              f"{writer.spans} spans ({writer.traces} traces) were written before",
              file=sys.stderr, flush=True)
        return 3
    print(f"wrote {writer.spans} spans ({writer.traces} traces) to {args.output}", flush=True)
    if writer.evaluations:
        print(f"wrote {writer.evaluations} evaluations (gen_ai.evaluation.result log "
              f"records) to {args.output}", flush=True)
    if writer.rotations:
        print(f"rotated {writer.rotations} times: older spans are in {args.output}.1, "
              f"{args.output}.2, ... (pass them all to baseline build or gate)", flush=True)
    return 0
