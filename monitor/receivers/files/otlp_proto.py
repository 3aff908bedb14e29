"""Collector ``fileexporter`` ``format: proto`` files: length-prefixed protobuf.

Each record is a 4-byte big-endian unsigned length followed by that many bytes of a
serialized ``ExportTraceServiceRequest`` (collector-contrib ``exporter/fileexporter``;
shared/reference/otel-conventions.md section 6). A file holding one bare, unframed
message (for example Tempo's ``Accept: application/protobuf`` answer) is read too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import IO

__all__ = ["MAX_FRAME_BYTES", "iter_proto_frames", "write_proto_frame"]

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
