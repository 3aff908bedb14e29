"""Collector ``fileexporter`` ``format: proto`` files: length-prefixed protobuf.

Each record is a 4-byte big-endian unsigned length followed by that many bytes of a
serialized ``ExportTraceServiceRequest`` (collector-contrib ``exporter/fileexporter``;
shared/reference/otel-conventions.md section 6), or of an ``ExportLogsServiceRequest`` in
a logs pipeline's file: :func:`proto_payload_is_logs` tells them apart, record by record,
so one file may mix both. A file holding one bare, unframed message (for example Tempo's
``Accept: application/protobuf`` answer) is read too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import IO

__all__ = ["MAX_FRAME_BYTES", "iter_proto_frames", "proto_payload_is_logs", "write_proto_frame"]

#: Largest frame accepted; a bigger length prefix means a corrupt or foreign file.
MAX_FRAME_BYTES = 256 * 1024 * 1024
_HEADER = struct.Struct(">I")


def iter_proto_frames(
    stream: IO[bytes], max_frame_bytes: int = MAX_FRAME_BYTES
) -> Iterator[tuple[int, bytes | None, str | None]]:
    """Yield ``(frame_number, payload, error)``; after a framing error the file ends.

    A framing error (truncated header or payload, absurd length) loses the record
    boundaries, so nothing after it can be trusted; a payload that fails to parse is the
    caller's business and does not stop the file.
    """
    n = 0
    while True:
        header = stream.read(4)
        if not header:
            return
        n += 1
        if len(header) < 4:
            yield n, None, f"truncated frame header ({len(header)} of 4 bytes)"
            return
        (length,) = _HEADER.unpack(header)
        if length > max_frame_bytes:
            yield (
                n,
                None,
                (
                    f"frame length {length} exceeds {max_frame_bytes} bytes: not a "
                    "length-prefixed OTLP proto file, or corrupt from here on"
                ),
            )
            return
        payload = stream.read(length)
        if len(payload) < length:
            yield n, None, f"truncated frame: {len(payload)} of {length} bytes"
            return
        yield n, payload, None


def write_proto_frame(stream: IO[bytes], payload: bytes) -> None:
    """Append one length-prefixed record (the Collector's framing)."""
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)


def proto_payload_is_logs(data: bytes | bytearray) -> bool:
    """Whether a serialized OTLP request holds log records rather than spans (for files
    that mix both), judged by the first record's first field: a ``Span`` starts with its
    trace id (field 1) or, lacking it, its span id (field 2), both length-delimited; a
    ``LogRecord`` starts with a time (fixed64), a severity (varint) or a later field.
    A request without records, or not walkable, counts as traces."""
    i, end = 0, len(data)
    try:
        for depth in range(3):  # request -> Resource* -> Scope* -> the first record
            found = False
            while i < end:
                tag, i = _varint(data, i)
                wire = tag & 7
                if wire == 2:
                    ln, i = _varint(data, i)
                    if tag >> 3 == (1 if depth == 0 else 2):
                        end = i + ln
                        found = True
                        break
                    i += ln
                elif wire == 0:
                    _, i = _varint(data, i)
                elif wire == 1:
                    i += 8
                elif wire == 5:
                    i += 4
                else:
                    return False
            if not found:
                return False
        if i >= end:
            return False
        return data[i] not in (0x0A, 0x12)
    except IndexError:
        return False


def _varint(data: bytes | bytearray, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise IndexError("varint longer than 10 bytes")
