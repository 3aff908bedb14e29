"""Span-file readers for offline replay, baselines and the gate.

:func:`read_spans` streams batches of :class:`~assaywatch.monitor.spans.SpanRecord` out
of OTLP JSON Lines (plain or gzip), Collector length-prefixed proto files, Jaeger JSON
and Tempo JSON, detecting the format from content; OTLP logs lines or frames in them give
evaluation records (``gen_ai.evaluation.result`` events). :func:`records_to_json` and
:func:`evaluations_to_json` write decoded records back as OTLP/JSON.
"""

from __future__ import annotations

from assaywatch.monitor.receivers.files.errors import (
    IssueCallback,
    ReadIssue,
    ReadStats,
    SpanFileError,
)
from assaywatch.monitor.receivers.files.otlp_json import (
    logs_request_to_json,
    request_to_json,
    write_otlp_json_lines,
)
from assaywatch.monitor.receivers.files.otlp_proto import write_proto_frame
from assaywatch.monitor.receivers.files.read import read_spans
from assaywatch.monitor.receivers.files.records_json import evaluations_to_json, records_to_json

__all__ = [
    "IssueCallback",
    "ReadIssue",
    "ReadStats",
    "SpanFileError",
    "evaluations_to_json",
    "logs_request_to_json",
    "read_spans",
    "records_to_json",
    "request_to_json",
    "write_otlp_json_lines",
    "write_proto_frame",
]
