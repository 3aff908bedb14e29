"""The write-ahead log of accepted spans: what the monitor acknowledges is on disk first.

``Pipeline.offer`` appends every batch here *before* it returns True (the receiver turns
True into an OTLP success). A restart restores the last checkpoint and replays the log from
the checkpoint's low-water mark (the position of the oldest span still pending in the
assembler), so a ``kill -9`` loses no acknowledged span.

**Files.** ``wal/`` in the state dir holds segments ``<seq>.wal`` (seq: 16 decimal
digits, increasing). A process appends only to a segment it created itself (a new one at
every start), so a torn tail left by a crash is never written after. A segment is closed
and the next one opened when it passes ``segment_bytes``. Segments wholly before the
checkpoint's low-water mark are deleted after the checkpoint is committed.

**Format.** A segment starts with the 8-byte magic ``AWWAL01\\n``; then records::

    u32 little-endian  payload length
    u32 little-endian  CRC-32 of the payload
    payload            UTF-8 JSON: [receiver, resources, spans]

``spans`` are arrays ``[trace_id, span_id, parent_span_id, name, start_ns, end_ns, kind,
status_code, status_message, attributes, events, resource_index, scope_name]``; spans of
one OTLP ResourceSpans share one entry of ``resources`` (as they share one dict in
memory). ``events`` are ``[name, time_ns, attributes]``. Attribute values that JSON
cannot hold as they are become one-key objects: ``{"b": base64}`` for bytes,
``{"a": [...]}`` for arrays (decoded back to tuples), ``{"m": {...}}`` for key-value
lists. No pickle: reading the log never executes anything. Records are written by orjson,
or by the standard library's ``json`` for a batch orjson cannot write exactly (a NaN or
infinite float, written ``NaN`` / ``Infinity``; a lone surrogate; an integer beyond 64
bits); the reader parses both.

A **position** is ``(seq, offset)``: the segment and the byte offset of a record's first
byte; positions compare as tuples, in the order records were written.

**Durability.** ``write()`` to the file returns once the kernel holds the bytes: they
survive the *process* dying (``kill -9``, an OOM kill, a crash), not the *machine* losing
power. Against power loss the log is ``fsync``-ed every ``fsync_seconds`` (0: before every
acknowledgement, which costs one disk flush per OTLP request; negative: never, left to the
kernel), at every rotation and before every checkpoint. A power cut can therefore lose the
last ``fsync_seconds`` of acknowledged spans; a process crash loses none.

A record whose length or CRC does not check ends its segment on reading (a torn tail
written when the process died mid-``write``: that batch was never acknowledged); it is
logged and the next segment is read.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from assaywatch.monitor.receivers.spans import SpanEvent, SpanRecord

logger = logging.getLogger(__name__)

MAGIC = b"AWWAL01\n"
WAL_DIR = "wal"
_HEADER = struct.Struct("<II")
#: Largest record accepted on reading: a corrupt length must not make us allocate 4 GiB.
MAX_RECORD_BYTES = 1 << 30

Position = tuple[int, int]

_PLAIN = (str, int, float, bool, type(None))


class _NonFinite(Exception):
    """A NaN or infinite float on orjson's path: orjson writes it as null, so the batch is
    written by the standard library's encoder instead (``NaN`` / ``Infinity``)."""


# -- value encoding ------------------------------------------------------------------------
def _enc(v: Any, strict: bool = False) -> Any:
    """``v`` as JSON can hold it (module docstring); ``strict``: raise :class:`_NonFinite`
    for a NaN or infinite float (orjson's path)."""
    t = type(v)
    if t in _PLAIN:
        if strict and t is float and v - v:  # v - v is NaN for NaN and +-inf, else 0.0
            raise _NonFinite
        return v
    if t is bytes or t is bytearray:
        return {"b": base64.b64encode(v).decode("ascii")}
    if t is tuple or t is list:
        return {"a": [_enc(x, strict) for x in v]}
    if t is dict:
        return {"m": {str(k): _enc(x, strict) for k, x in v.items()}}
    if isinstance(v, (str, int, float)):  # subclasses (bool is exact above)
        return v
    return str(v)


def _dec(v: Any) -> Any:
    if type(v) is not dict:
        return v
    if "b" in v:
        return base64.b64decode(v["b"])
    if "a" in v:
        return tuple(_dec(x) for x in v["a"])
    if "m" in v:
        return {k: _dec(x) for k, x in v["m"].items()}
    raise ValueError(f"unknown value tag {sorted(v)!r}")


def _enc_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    # the hot path: almost every value is a plain scalar
    for v in attrs.values():
        if type(v) not in _PLAIN:
            return {k: _enc(x) for k, x in attrs.items()}
    return attrs


def _enc_attrs_strict(attrs: dict[str, Any]) -> dict[str, Any]:
    """:func:`_enc_attrs` for orjson: raises :class:`_NonFinite` for a NaN or infinite
    float."""
    for v in attrs.values():
        t = type(v)
        if t is float:
            if v - v:
                raise _NonFinite
        elif t not in _PLAIN:
            return {k: _enc(x, True) for k, x in attrs.items()}
    return attrs


def _dec_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    for v in attrs.values():
        if type(v) is dict:
            return {k: _dec(x) for k, x in attrs.items()}
    return attrs


def encode_batch(receiver: str, spans: list[SpanRecord]) -> bytes:
    """One record's payload (see the module docstring).

    Written by orjson (a C encoder, ~6x the standard library's speed on span batches);
    a batch orjson cannot write exactly (a NaN or infinite float, which it would write as
    null; a lone surrogate or an integer beyond 64 bits, which it refuses) is written by
    the standard library's ``json`` as before. Both give the JSON the reader parses, and
    the same records back."""
    try:
        return orjson.dumps(_payload(receiver, spans, _enc_attrs_strict))
    except (_NonFinite, orjson.JSONEncodeError):
        return json.dumps(_payload(receiver, spans, _enc_attrs), separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8", "surrogatepass")


def _payload(receiver: str, spans: list[SpanRecord],
             enc_attrs: Callable[[dict[str, Any]], dict[str, Any]]) -> list[Any]:
    """``[receiver, resources, spans]`` of one record, attributes through ``enc_attrs``."""
    res_index: dict[int, int] = {}
    resources: list[dict[str, Any]] = []
    rows = []
    for s in spans:
        rid = id(s.resource)
        ri = res_index.get(rid)
        if ri is None:
            ri = res_index[rid] = len(resources)
            resources.append(enc_attrs(s.resource))
        rows.append([s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_ns, s.end_ns,
                     s.kind, s.status_code, s.status_message, enc_attrs(s.attributes),
                     [[e.name, e.time_ns, enc_attrs(e.attributes)] for e in s.events]
                     if s.events else 0, ri, s.scope_name])
    return [receiver, resources, rows]


def decode_batch(payload: bytes) -> tuple[str, list[SpanRecord]]:
    receiver, resources, rows = json.loads(payload.decode("utf-8", "surrogatepass"))
    res = [_dec_attrs(r) for r in resources]
    spans = []
    for (tid, sid, parent, name, start, end, kind, code, msg, attrs, events, ri,
         scope) in rows:
        spans.append(SpanRecord(
            trace_id=tid, span_id=sid, parent_span_id=parent, name=name, start_ns=start,
            end_ns=end, kind=kind, status_code=code, status_message=msg,
            attributes=_dec_attrs(attrs),
            events=[SpanEvent(n, t, _dec_attrs(a)) for n, t, a in events] if events else [],
            resource=res[ri], scope_name=scope))
    return receiver, spans


# -- the log -------------------------------------------------------------------------------
class WalError(Exception):
    """The log cannot be written (disk full, permissions): the batch is not acknowledged."""


class WriteAheadLog:
    """Segmented append-only log of span batches under ``state_dir/wal``.

    ``append`` is called with the pipeline's intake lock held (one writer at a time, in
    the order batches are queued); ``sync`` may be called from any thread.
    """

    def __init__(self, state_dir: str | os.PathLike[str], segment_bytes: int = 64 << 20,
                 fsync_seconds: float = 1.0) -> None:
        self.dir = Path(state_dir) / WAL_DIR
        self.segment_bytes = max(4096, int(segment_bytes))
        self.fsync_seconds = float(fsync_seconds)
        self._lock = threading.Lock()
        self._fh: Any = None
        self._seq = 0
        self._offset = 0
        self._dirty = False
        self._last_sync = time.monotonic()
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None

    # -- reading -------------------------------------------------------------------------
    def segments(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        out = []
        for p in self.dir.iterdir():
            if p.suffix == ".wal" and p.stem.isdigit():
                out.append(int(p.stem))
        return sorted(out)

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:016d}.wal"

    def read_from(self, start: Position) -> Iterator[tuple[Position, str, list[SpanRecord]]]:
        """Every readable record at or after ``start``: ``(position, receiver, spans)``."""
        for seq in self.segments():
            if seq < start[0] or (self._fh is not None and seq >= self._seq):
                continue
            first = start[1] if seq == start[0] else len(MAGIC)
            yield from self._read_segment(seq, max(first, len(MAGIC)))

    def _read_segment(self, seq: int, offset: int,
                      ) -> Iterator[tuple[Position, str, list[SpanRecord]]]:
        path = self._path(seq)
        with open(path, "rb") as fh:
            if fh.read(len(MAGIC)) != MAGIC:
                logger.error("%s is not a write-ahead log segment; skipped", path)
                return
            fh.seek(offset)
            while True:
                pos = fh.tell()
                head = fh.read(_HEADER.size)
                if not head:
                    return
                why = ""
                if len(head) < _HEADER.size:
                    why = "a torn record header"
                else:
                    n, crc = _HEADER.unpack(head)
                    payload = fh.read(n) if n <= MAX_RECORD_BYTES else b""
                    if n > MAX_RECORD_BYTES or len(payload) < n:
                        why = "a torn record"
                    elif zlib.crc32(payload) != crc:
                        why = "a record failing its CRC"
                if why:
                    logger.warning("%s: %s at byte %d (written as the process died, never "
                                   "acknowledged); the rest of the segment is skipped",
                                   path, why, pos)
                    return
                try:
                    receiver, spans = decode_batch(payload)
                except Exception as exc:
                    logger.error("%s: undecodable record at byte %d (%s); skipped",
                                 path, pos, exc)
                    continue
                yield (seq, pos), receiver, spans

    # -- writing -------------------------------------------------------------------------
    def open(self) -> None:
        """Start a new segment after every existing one, and the fsync timer."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            segs = self.segments()
            self._open_segment((segs[-1] + 1) if segs else 1)
        except OSError as exc:
            raise WalError(f"cannot open the write-ahead log in {self.dir}: "
                           f"{exc.strerror or exc}") from None
        if self.fsync_seconds > 0:
            self._syncer = threading.Thread(target=self._sync_loop, daemon=True,
                                            name="assaywatch-wal-fsync")
            self._syncer.start()

    def _open_segment(self, seq: int) -> None:
        path = self._path(seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        fh = os.fdopen(fd, "wb", buffering=0)
        fh.write(MAGIC)
        self._fh, self._seq, self._offset = fh, seq, len(MAGIC)
        self._dirty = True
        _fsync_dir(self.dir)

    def end(self) -> Position:
        """Position the next record will get."""
        return (self._seq, self._offset)

    def append(self, payload: bytes) -> tuple[Position, Position]:
        """Write one record; returns its position and the position after it. Raises
        :class:`WalError` when the bytes are not all with the kernel."""
        if self._fh is None:
            raise WalError("the write-ahead log is closed")
        record = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            try:
                if self._offset > len(MAGIC) and \
                        self._offset + len(record) > self.segment_bytes:
                    self._rotate()
                pos = (self._seq, self._offset)
                written = self._fh.write(record)
                while written < len(record):  # an unbuffered write may be short
                    written += self._fh.write(record[written:])
            except OSError as exc:
                # a partial record is a torn tail: the next start skips it; move on to a
                # fresh segment so that later records are not written behind it
                self._broken(exc)
                raise WalError(f"write-ahead log write failed: {exc.strerror or exc}"
                               ) from None
            self._offset += len(record)
            self._dirty = True
            if self.fsync_seconds == 0:
                self._sync_locked()
            return pos, (self._seq, self._offset)

    def _broken(self, exc: OSError) -> None:
        logger.error("write-ahead log write failed (%s); starting a new segment", exc)
        try:
            self._fh.close()
            self._open_segment(self._seq + 1)
        except OSError:
            logger.exception("cannot start a new write-ahead log segment")

    def _rotate(self) -> None:
        self._sync_locked()
        self._fh.close()
        self._open_segment(self._seq + 1)

    def _sync_locked(self) -> None:
        if self._dirty and self._fh is not None:
            os.fsync(self._fh.fileno())
            self._dirty = False
        self._last_sync = time.monotonic()

    def sync(self) -> None:
        """Flush what was written to the disk (power-loss durability up to here)."""
        with self._lock:
            try:
                self._sync_locked()
            except OSError:
                logger.exception("write-ahead log fsync failed")

    def _sync_loop(self) -> None:
        while not self._stop.wait(self.fsync_seconds):
            self.sync()

    def delete_before(self, low: Position) -> int:
        """Delete the segments that hold only records before ``low``; returns how many."""
        n = 0
        for seq in self.segments():
            if seq >= low[0] or seq >= self._seq:
                break
            try:
                self._path(seq).unlink()
                n += 1
            except OSError:
                logger.exception("cannot delete write-ahead log segment %d", seq)
        return n

    def size_bytes(self) -> int:
        total = 0
        for seq in self.segments():
            try:
                total += self._path(seq).stat().st_size
            except OSError:
                pass
        return total

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._fh is not None:
                try:
                    self._sync_locked()
                finally:
                    self._fh.close()
                    self._fh = None
        if self._syncer is not None:
            self._syncer.join(timeout=5)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
