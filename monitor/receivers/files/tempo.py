"""Tempo trace-by-id JSON (``GET /api/traces/<id>``) to span records.

Tempo answers with OTLP/JSON under ``batches`` (``tempopb.Trace``, wire-identical to
``TracesData``); some versions and tools write ``resourceSpans``, and the v2 API wraps
it as ``{"trace": {...}}`` (shared/reference/otel-conventions.md section 6), so all
three are accepted. Tempo writes ids as base64, which the OTLP/JSON walker recognises by
length.
"""

from __future__ import annotations

from typing import Any

from assaywatch.monitor.receivers.otlp.decode import DecodeLimits, DecodeResult
from assaywatch.monitor.receivers.otlp.decode_json import decode_json_resource_spans

__all__ = ["is_tempo_document", "tempo_document_to_records"]


def is_tempo_document(doc: Any) -> bool:
    return isinstance(doc, dict) and ("batches" in doc or isinstance(doc.get("trace"), dict))


def tempo_document_to_records(
    doc: dict[str, Any], limits: DecodeLimits | None = None
) -> DecodeResult:
    """Decode a Tempo trace document (``batches``, ``resourceSpans`` or ``trace.*``)."""
    inner = doc.get("trace") if isinstance(doc.get("trace"), dict) else doc
    if not isinstance(inner, dict):
        return DecodeResult()
    batches = inner.get("batches")
    if batches is None:
        batches = inner.get("resourceSpans", inner.get("resource_spans"))
    return decode_json_resource_spans(batches, limits)
