"""The OTLP receiving edge: request decoding and the gRPC and HTTP receivers.

Protocol types stay here; what leaves this package is a list of
:class:`~assaywatch.monitor.receivers.spans.SpanRecord`.
"""

from __future__ import annotations

from assaywatch.monitor.receivers.otlp.decode import (
    DecodeError,
    DecodeLimits,
    DecodeResult,
    decode_proto_request,
    records_from_request,
)
from assaywatch.monitor.receivers.otlp.decode_json import (
    decode_json_request,
    decode_json_resource_spans,
)

__all__ = [
    "DecodeError",
    "DecodeLimits",
    "DecodeResult",
    "decode_json_request",
    "decode_json_resource_spans",
    "decode_proto_request",
    "records_from_request",
]
