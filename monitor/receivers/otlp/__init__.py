"""The OTLP receiving edge: request decoding and the gRPC and HTTP receivers.

Protocol types stay here; what leaves this package is a list of
:class:`~assaywatch.monitor.receivers.spans.SpanRecord` (spans, and the
``gen_ai.evaluation.result`` events of OTLP logs as evaluation records).
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
from assaywatch.monitor.receivers.otlp.decode_logs import LogsDecodeResult, decode_proto_logs
from assaywatch.monitor.receivers.otlp.decode_logs_json import decode_json_logs

__all__ = [
    "DecodeError",
    "DecodeLimits",
    "DecodeResult",
    "LogsDecodeResult",
    "decode_json_logs",
    "decode_json_request",
    "decode_json_resource_spans",
    "decode_proto_logs",
    "decode_proto_request",
    "records_from_request",
]
