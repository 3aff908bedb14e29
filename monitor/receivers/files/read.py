"""``read_spans``: stream span records out of span files of any supported format.

Format detection looks at content, never at the file name:

1. gzip magic ``1f 8b`` -> inflate on the fly (multi-member files too) and look again;
   zstd magic -> refused with a hint (no zstd decoder in the standard library).
2. First non-blank byte ``{`` or ``[`` -> JSON. If the first line is a complete JSON
   value the file is JSON Lines (OTLP, one request per line; a line may also hold a
   Tempo or Jaeger document). Otherwise, when the first line merely opens a document
   (pretty-printed JSON), the file is one document: Jaeger (``data``, or
   ``traceID`` + ``spans``), Tempo (``batches``, ``trace``) or OTLP (``resourceSpans``).
3. Byte ``0a`` (field 1, length-delimited) -> one bare ``ExportTraceServiceRequest``.
4. Anything else -> Collector length-prefixed proto frames.

OTLP logs (a ``resourceLogs`` line or document, an ``ExportLogsServiceRequest`` frame)
may be mixed with spans in one file: their ``gen_ai.evaluation.result`` events are
yielded as evaluation records (``kind == KIND_EVALUATION``,
:mod:`~assaywatch.monitor.receivers.otlp.decode_logs`) in the same batches stream, so
``baseline build``, ``gate`` and ``replay`` see them; other log records are skipped
(counted in :class:`ReadStats`).

JSON Lines and proto frames are read record by record, so memory is bounded by one
record; Jaeger and Tempo documents are parsed whole (they are single traces in practice).
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterator, Sequence
from typing import IO, Any

from assaywatch.monitor.receivers.files.errors import (
    IssueCallback,
    ReadIssue,
    ReadStats,
    SpanFileError,
)
from assaywatch.monitor.receivers.files.jaeger import jaeger_document_to_records
from assaywatch.monitor.receivers.files.otlp_json import iter_json_lines
from assaywatch.monitor.receivers.files.otlp_proto import (
    iter_proto_frames,
    proto_payload_is_logs,
)
from assaywatch.monitor.receivers.files.tempo import is_tempo_document, tempo_document_to_records
from assaywatch.monitor.receivers.otlp.decode import (
    DecodeError,
    DecodeLimits,
    DecodeResult,
    decode_proto_request,
)
from assaywatch.monitor.receivers.otlp.decode_json import decode_json_request
from assaywatch.monitor.receivers.otlp.decode_logs import LogsDecodeResult, decode_proto_logs
from assaywatch.monitor.receivers.otlp.decode_logs_json import decode_json_logs
from assaywatch.monitor.receivers.spans import SpanRecord

__all__ = ["read_spans"]

logger = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_WS = b" \t\r\n"


class _File:
    """Per-file context: turns issues into callbacks, counts or exceptions."""

    def __init__(
        self, path: str, strict: bool, on_error: IssueCallback | None, stats: ReadStats
    ) -> None:
        self.path, self.strict, self.on_error, self.stats = path, strict, on_error, stats

    def issue(self, line: int, reason: str) -> None:
        issue = ReadIssue(self.path, line, reason)
        self.stats.issues += 1
        if self.on_error is not None:
            self.on_error(issue)
        if self.strict:
            raise SpanFileError(issue)
        logger.warning("skipping bad span-file record: %s", issue)

    def take(self, line: int, result: DecodeResult) -> list[SpanRecord]:
        self.stats.records += 1
        if isinstance(result, LogsDecodeResult):
            self.stats.evaluations += len(result.spans)
            self.stats.other_log_records += result.other
        else:
            self.stats.spans += len(result.spans)
        self.stats.rejected.update(result.rejected)
        self.stats.limited.update(result.limited)
        if result.rejected:
            self.issue(line, result.error_message)
        return result.spans


def _document_results(doc: Any, limits: DecodeLimits | None) -> list[DecodeResult]:
    """Dispatch one parsed JSON document by its keys."""
    if isinstance(doc, dict):
        spans = "resourceSpans" in doc or "resource_spans" in doc
        logs = "resourceLogs" in doc or "resource_logs" in doc
        if spans or logs:
            results: list[DecodeResult] = []
            if spans:
                results.append(decode_json_request(doc, limits))
            if logs:
                results.append(decode_json_logs(doc, limits))
            return results
        if is_tempo_document(doc):
            return [tempo_document_to_records(doc, limits)]
        if "data" in doc or ("spans" in doc and "traceID" in doc):
            return jaeger_document_to_records(doc, limits)
        if not doc:
            return [DecodeResult()]
    if isinstance(doc, list) and all(isinstance(t, dict) and "spans" in t for t in doc):
        return jaeger_document_to_records(doc, limits)
    raise DecodeError(
        "unknown_document",
        "not a span document: expected OTLP 'resourceSpans' (or 'resourceLogs'), Tempo "
        "'batches' or Jaeger 'data'",
    )


def _read_json(
    stream: IO[bytes], ctx: _File, limits: DecodeLimits | None
) -> Iterator[list[SpanRecord]]:
    first = stream.readline()
    head = first.strip()
    try:
        json.loads(first)
        whole = False
    except (ValueError, RecursionError):
        # A first line that only opens a value ("{", "[", '{"data": [') is pretty JSON.
        whole = head in (b"{", b"[") or head.endswith((b"{", b"[", b","))
    if whole:
        text = first + stream.read()
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:
            ctx.issue(getattr(exc, "lineno", 0), f"invalid JSON document: {exc}")
            return
        try:
            results = _document_results(doc, limits)
        except DecodeError as err:
            ctx.issue(1, err.message)
            return
        for result in results:
            if spans := ctx.take(1, result):
                yield spans
        return
    for lineno, doc, error in _chain_first(first, stream):
        if error is not None:
            ctx.issue(lineno, error)
            continue
        try:
            results = _document_results(doc, limits)
        except DecodeError as err:
            ctx.issue(lineno, err.message)
            continue
        for result in results:
            if spans := ctx.take(lineno, result):
                yield spans


def _chain_first(first: bytes, stream: IO[bytes]) -> Iterator[tuple[int, Any, str | None]]:
    if first.strip():
        try:
            yield 1, json.loads(first), None
        except (ValueError, RecursionError) as exc:
            yield 1, None, f"invalid JSON: {exc}"
    yield from iter_json_lines(stream, first_line=2)


def _read_proto(
    stream: IO[bytes], ctx: _File, limits: DecodeLimits | None, framed: bool
) -> Iterator[list[SpanRecord]]:
    frames = iter_proto_frames(stream) if framed else iter([(1, stream.read(), None)])
    for n, payload, error in frames:
        if error is not None or payload is None:
            ctx.issue(n, error or "unreadable frame")
            continue
        try:
            result = (decode_proto_logs(payload, limits) if proto_payload_is_logs(payload)
                      else decode_proto_request(payload, limits))
        except DecodeError as err:
            ctx.issue(n, err.message)
            continue
        if spans := ctx.take(n, result):
            yield spans


def _read_stream(
    stream: IO[bytes], ctx: _File, limits: DecodeLimits | None, depth: int = 0
) -> Iterator[list[SpanRecord]]:
    peek: bytes = stream.peek(64)[:64]  # type: ignore[attr-defined]
    if peek.startswith(_GZIP_MAGIC) and depth == 0:
        with gzip.GzipFile(fileobj=stream, mode="rb") as gz:
            yield from _read_stream(gz, ctx, limits, depth + 1)  # type: ignore[arg-type]
        return
    if peek.startswith(_ZSTD_MAGIC):
        ctx.issue(0, "zstd-compressed span file: decompress it first (zstd -d FILE)")
        return
    if not peek:
        return
    lead = peek.lstrip(_WS)[:1]
    if lead in (b"{", b"[", b""):  # b"": only blank lines so far, i.e. JSON Lines
        yield from _read_json(stream, ctx, limits)
    else:
        yield from _read_proto(stream, ctx, limits, framed=lead != b"\x0a")


def read_spans(
    paths: Sequence[str],
    strict: bool = False,
    on_error: IssueCallback | None = None,
    limits: DecodeLimits | None = None,
    stats: ReadStats | None = None,
) -> Iterator[list[SpanRecord]]:
    """Yield batches of span records from span files, in file order.

    Parameters
    ----------
    paths:
        Files in any supported format (detected from content; see module docstring).
    strict:
        Raise :class:`SpanFileError` at the first bad record instead of skipping it.
    on_error:
        Called with a :class:`ReadIssue` (file, line or frame, reason) for every bad
        record or rejected span batch, before skipping (or raising, when strict).
    limits:
        Per-span decode limits.
    stats:
        Filled with totals (records, spans, issues, rejects) as reading proceeds.

    Yields
    ------
    list[SpanRecord]
        One batch per line / frame / trace, never empty: spans, or the evaluation
        records (``kind == KIND_EVALUATION``) of an OTLP logs line or frame.
    """
    if isinstance(paths, str | bytes):
        raise TypeError("read_spans expects a sequence of paths, not one path string")
    return _iter_files(paths, strict, on_error, limits, stats if stats is not None else ReadStats())


def _iter_files(
    paths: Sequence[str],
    strict: bool,
    on_error: IssueCallback | None,
    limits: DecodeLimits | None,
    totals: ReadStats,
) -> Iterator[list[SpanRecord]]:
    for path in paths:
        ctx = _File(str(path), strict, on_error, totals)
        try:
            fh = open(path, "rb")  # closed by the with below
        except OSError as exc:
            ctx.issue(0, f"cannot open span file: {exc.strerror or exc}")
            continue
        totals.files += 1
        with fh:
            try:
                yield from _read_stream(fh, ctx, limits)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                ctx.issue(0, f"file is unreadable or truncated: {exc}")
