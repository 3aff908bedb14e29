"""Configure the OpenTelemetry SDK for traces, unless the application already has.

Precedence (shared/STYLE.md): explicit argument > environment variable > default.

======================================  ===================================================
Variable                                Use
======================================  ===================================================
``OTEL_SDK_DISABLED``                   ``true``: configure nothing
``OTEL_TRACES_EXPORTER``                ``otlp`` (default), ``console`` or ``none``
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``  then ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc``
                                        (default, port 4317, like opentelemetry-distro) or
                                        ``http/protobuf`` (port 4318); ``http/json`` is
                                        not supported by the Python exporter and falls
                                        back to ``http/protobuf`` with a warning
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` read by the exporter itself (default
                                        ``http://localhost:4317`` / ``:4318/v1/traces``:
                                        the local ``assaywatch monitor``)
``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS``  read by the exporter itself
``OTEL_SERVICE_NAME``,                  read by the SDK's resource detector
``OTEL_RESOURCE_ATTRIBUTES``
``ASSAYWATCH_SPANS_FILE``               also append the spans to this file as OTLP JSON
                                        Lines (gzip when it ends in ``.gz``): the span
                                        file ``assaywatch baseline build`` and ``gate``
                                        read (:class:`SpansFileExporter`)
======================================  ===================================================

The SDK is imported only inside :func:`configure_sdk` and the exporters' methods, so
importing this module is cheap.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from assaywatch.instrumentation import attributes as A
from assaywatch.instrumentation._safety import logger, report

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

ENV_SPANS_FILE = "ASSAYWATCH_SPANS_FILE"
ENV_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
ENV_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
ENV_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_PROTOCOL = "grpc"


def sdk_disabled() -> bool:
    """Whether ``OTEL_SDK_DISABLED`` is set to true (case-insensitive)."""
    return os.environ.get(A.ENV_SDK_DISABLED, "").strip().lower() == "true"


def app_has_provider() -> bool:
    """Whether a tracer provider has already been set (by the app, a distro, or us)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def resolve_protocol(protocol: str | None = None) -> str:
    """The OTLP protocol: the argument, else the traces/generic variable, else ``grpc``.

    Raises
    ------
    ValueError
        For an explicit argument outside :data:`PROTOCOLS` (a bad environment value only
        logs and falls back).
    """
    if protocol is not None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        return protocol
    raw = os.environ.get(ENV_TRACES_PROTOCOL) or os.environ.get(ENV_PROTOCOL)
    if raw is None:
        return DEFAULT_PROTOCOL
    value = raw.strip().lower()
    if value in PROTOCOLS:
        return value
    if value == "http/json":
        logger.warning("OTLP protocol http/json is not supported by the Python exporter; "
                       "using http/protobuf (the monitor accepts both)")
        return "http/protobuf"
    logger.warning("ignoring %s=%r: expected one of %s; using %s",
                   ENV_PROTOCOL, raw, PROTOCOLS, DEFAULT_PROTOCOL)
    return DEFAULT_PROTOCOL


def make_exporter(*, protocol: str | None = None, endpoint: str | None = None,
                  headers: Mapping[str, str] | None = None) -> SpanExporter:
    """An OTLP span exporter for ``protocol``; endpoint and headers fall back to the
    exporter's own reading of the ``OTEL_EXPORTER_OTLP_*`` variables.

    ``endpoint`` is a base URL like the generic variable (``http://host:4318``): for
    HTTP, ``/v1/traces`` is appended unless already there.
    """
    proto = resolve_protocol(protocol)
    hdrs = dict(headers) if headers is not None else None
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint, headers=hdrs)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint, headers=hdrs)


def _hex_ids(obj: dict[str, Any]) -> None:
    """protobuf's JSON writes ``bytes`` ids in base64; OTLP/JSON wants hex (in place)."""
    for key in ("traceId", "spanId", "parentSpanId"):
        value = obj.get(key)
        if isinstance(value, str):
            obj[key] = base64.b64decode(value).hex()


def spans_to_json_line(spans: Sequence[ReadableSpan]) -> bytes:
    """Finished SDK spans as one OTLP/JSON ``ExportTraceServiceRequest`` line (UTF-8,
    ending in a newline): the SDK's own OTLP encoder, rendered by protobuf's JSON writer
    with integer enums, then hex trace and span ids as the OTLP/JSON spec prescribes."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


def _append(path: str, data: bytes) -> None:
    """Append ``data`` with one ``write`` on an ``O_APPEND`` descriptor, holding an
    exclusive ``flock`` on the file: processes sharing the file never interleave their
    lines, whatever their size (an ``O_APPEND`` write alone is only guaranteed whole up
    to ``PIPE_BUF`` on every system). Without ``fcntl`` (Windows) the lock is skipped."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                 0o666)
    try:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            fcntl = None  # type: ignore[assignment]
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)  # closing releases the lock


class SpansFileExporter:
    """A span exporter appending OTLP JSON Lines to a file (``ASSAYWATCH_SPANS_FILE``).

    One line (one ``ExportTraceServiceRequest``) per exported batch; a path ending in
    ``.gz`` gets each batch as its own gzip member, which gzip readers (and ours)
    concatenate. The file is opened, locked, appended to and closed per batch, so
    several processes can write the same file (see :func:`_append`) and nothing stays
    buffered in this process between batches. A write error is logged once and the batch
    reported as failed; it never reaches the agent.

    Duck-typed ``SpanExporter`` (``export``, ``shutdown``, ``force_flush``), so that
    importing this module does not import the SDK.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.compress = path.endswith(".gz")
        folder = os.path.dirname(path)
        if folder:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError:
                pass  # reported by the first export that cannot write

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = spans_to_json_line(spans)
            _append(self.path, gzip.compress(line, mtime=0) if self.compress else line)
        except Exception:  # noqa: BLE001 - telemetry must never break the agent
            report("spans_file")
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _exporter_from_env() -> SpanExporter | None:
    names = [n.strip().lower() for n in os.environ.get(ENV_TRACES_EXPORTER, "otlp").split(",")]
    if "none" in names:
        return None
    if names == ["console"]:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    unknown = [n for n in names if n not in {"otlp", "console", ""}]
    if unknown:
        logger.warning("ignoring %s values %s: assaywatch supports otlp, console, none",
                       ENV_TRACES_EXPORTER, unknown)
    return make_exporter()


def configure_sdk(*, service_name: str | None = None, exporter: SpanExporter | None = None,
                  protocol: str | None = None, endpoint: str | None = None,
                  headers: Mapping[str, str] | None = None,
                  resource_attributes: Mapping[str, str] | None = None,
                  batch: bool = True, spans_file: str | None = None) -> TracerProvider | None:
    """Install an SDK tracer provider exporting OTLP, unless one is already set.

    Parameters
    ----------
    service_name:
        ``service.name`` (overrides ``OTEL_SERVICE_NAME``): the monitor's fallback agent
        name when spans carry no ``gen_ai.agent.name``.
    exporter:
        A ready exporter (tests, custom backends); default: OTLP per the variables.
    protocol, endpoint, headers:
        Override the ``OTEL_EXPORTER_OTLP_*`` variables (see the module table).
    resource_attributes:
        Merged over ``OTEL_RESOURCE_ATTRIBUTES``.
    batch:
        Batch span processor (default; exporting never blocks the agent) or simple
        (synchronous; for tests and short scripts).
    spans_file:
        Also append every span to this file as OTLP JSON Lines (overrides
        ``ASSAYWATCH_SPANS_FILE``; "" turns it off), through its own processor, so a slow
        or unreachable OTLP endpoint never delays the file. A batch processor by default:
        the JSON encoding and the locked append run on its worker thread, never on the
        agent's, and each line holds up to 512 spans; the provider's shutdown at exit
        flushes it. Applies only when this call installs the provider.

    Returns
    -------
    TracerProvider | None
        The provider installed, or None when the app already had one (it is kept with its
        exporters untouched) or the SDK is disabled.
    """
    if sdk_disabled():
        logger.debug("%s=true: not configuring the SDK", A.ENV_SDK_DISABLED)
        return None
    if spans_file is None:
        spans_file = os.environ.get(ENV_SPANS_FILE, "").strip()
    if app_has_provider():
        logger.debug("a tracer provider is already set; keeping it and its exporters")
        if spans_file:
            logger.warning("%s=%s is not applied: the application set its own tracer "
                           "provider; add a processor with "
                           "assaywatch.instrumentation.setup.SpansFileExporter to it",
                           ENV_SPANS_FILE, spans_file)
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    attrs: dict[str, str] = dict(resource_attributes or {})
    if service_name is not None:
        attrs[SERVICE_NAME] = service_name
    provider = TracerProvider(resource=Resource.create(attrs))
    chosen = exporter if exporter is not None else (
        _exporter_from_env() if (protocol, endpoint, headers) == (None, None, None)
        else make_exporter(protocol=protocol, endpoint=endpoint, headers=headers))
    if chosen is not None:
        processor = BatchSpanProcessor(chosen) if batch else SimpleSpanProcessor(chosen)
        provider.add_span_processor(processor)
    if spans_file:
        to_file = SpansFileExporter(spans_file)
        provider.add_span_processor(
            BatchSpanProcessor(to_file) if batch else SimpleSpanProcessor(to_file))  # type: ignore[arg-type]
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:  # lost a race with another setter
        provider.shutdown()
        return None
    return provider
