"""Span-file readers for offline replay, baselines and the gate.

:func:`read_spans` streams batches of :class:`~assaywatch.monitor.spans.SpanRecord` out
of OTLP JSON Lines (plain or gzip), Collector length-prefixed proto files, Jaeger JSON
and Tempo JSON, detecting the format from content.
"""

from __future__ import annotations

from assaywatch.monitor.receivers.files.errors import (
    IssueCallback,
    ReadIssue,
    ReadStats,
    SpanFileError,
)
from assaywatch.monitor.receivers.files.otlp_json import request_to_json, write_otlp_json_lines
from assaywatch.monitor.receivers.files.otlp_proto import write_proto_frame
from assaywatch.monitor.receivers.files.read import read_spans

__all__ = [
    "IssueCallback",
    "ReadIssue",
    "ReadStats",
    "SpanFileError",
    "read_spans",
    "request_to_json",
    "write_otlp_json_lines",
    "write_proto_frame",
]
