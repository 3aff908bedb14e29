"""The event log: append-only JSON Lines of alarm onsets and state changes in the state dir.

Each line is one record, fsynced before the append returns, so a consumer tailing the file
never reads half a record. ``"event"`` says which kind:

* ``"alarm"`` - an alarm onset with its evidence (``AlarmEvent.to_dict``);
* ``"rebaseline"`` - a stream told to learn its baseline again over the API
  (``POST /api/rebaseline``, ``assaywatch baseline reset``), with who asked
  (:func:`state_change`: the caller's token id, a hash prefix never the token, and remote
  address) and whether the stream existed.

A ``kill -9`` inside an append can leave a torn last line (bytes after the last newline).
The log repairs it when it is opened (:class:`EventLog` is constructed by the one process
that writes it) and before an append that follows a failed one: the torn tail is appended
to ``events.jsonl.torn`` beside it (nothing is silently destroyed) and the log truncated
to its last newline, with a warning. The tail is never kept in the log, even when it is a
whole record short of its newline: its append never returned, so what it recorded was not
acknowledged (a re-baseline's caller got no answer; an alarm onset is fired again by the
replay). :meth:`EventLog.read` skips a line that is not a JSON object (counted in
``unreadable_lines``, with a warning naming its line number) instead of raising.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

EVENTS_NAME = "events.jsonl"
#: Where a torn last line is moved (beside the log), one fragment per line.
TORN_SUFFIX = ".torn"
#: Unreadable lines a ``read`` names one warning each; the rest are summed up in one.
_WARN_LINES = 10

logger = logging.getLogger(__name__)


def token_id(token: str) -> str:
    """A caller's id in the log: the first 12 hex digits of SHA-256 of its token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:12]


def state_change(event: str, what: dict[str, Any], token: str, remote: str) -> dict[str, Any]:
    """One state-change record: ``event``, what changed, who (token id, remote address)
    and when (Unix seconds and UTC ISO 8601)."""
    now = time.time()
    return {"event": event, **what,
            "by": {"token_id": token_id(token), "remote": remote},
            "time": now, "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}


class EventLog:
    """Append-only JSON Lines of alarm onsets and state changes (``events.jsonl`` in the
    state dir).

    Construct it in the process that writes the log (it repairs a torn last line, see the
    module docstring); ``torn_bytes`` says how many bytes this instance moved aside.
    """

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / EVENTS_NAME
        self.torn_path = self.path.with_name(EVENTS_NAME + TORN_SUFFIX)
        self._lock = threading.Lock()
        #: lines of the last :meth:`read` that were skipped (not a JSON object)
        self.unreadable_lines = 0
        #: bytes of torn last lines this instance moved to ``torn_path``
        self.torn_bytes = 0
        self._check_tail = True
        with self._lock:
            try:
                self._repair_locked()
            except OSError as exc:  # the first append tries again (and raises)
                logger.warning("%s: cannot check the last line: %s", self.path, exc)

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, allow_nan=False, default=str)
        with self._lock:
            if self._check_tail:
                self._repair_locked()
            self._check_tail = True  # until this append returns: it may tear the line
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            self._check_tail = False

    def _repair_locked(self) -> None:
        """Move a torn last line to ``torn_path`` and cut the log at its last newline."""
        try:
            fh = open(self.path, "rb+")
        except FileNotFoundError:
            self._check_tail = False
            return
        with fh:
            size = fh.seek(0, os.SEEK_END)
            if size:
                fh.seek(size - 1)
            if not size or fh.read(1) == b"\n":
                self._check_tail = False
                return
            cut = _after_last_newline(fh, size)
            fh.seek(cut)
            tail = fh.read(size - cut)
            with open(self.torn_path, "ab") as torn:
                torn.write(tail + b"\n")
                torn.flush()
                os.fsync(torn.fileno())
            fh.truncate(cut)
            fh.flush()
            os.fsync(fh.fileno())
        self.torn_bytes += len(tail)
        self._check_tail = False
        logger.warning("%s: its last line was torn (%d bytes after the last newline, "
                       "written by an append that never returned, e.g. the process was "
                       "killed); moved to %s and the log cut at byte %d",
                       self.path, len(tail), self.torn_path.name, cut)

    def read(self) -> list[dict[str, Any]]:
        """Every record, in order. A line that is not a JSON object (a torn last line
        read while it is written, garbage) is skipped with a warning naming its line
        number and counted in ``unreadable_lines`` (of this read)."""
        self.unreadable_lines = 0
        if not self.path.exists():
            return []
        records: list[dict[str, Any]] = []
        bad: list[int] = []
        with open(self.path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:  # JSONDecodeError and UnicodeDecodeError
                    record = None
                if isinstance(record, dict):
                    records.append(record)
                else:
                    bad.append(number)
        self.unreadable_lines = len(bad)
        for number in bad[:_WARN_LINES]:
            logger.warning("%s: line %d is not a JSON record; skipped", self.path, number)
        if len(bad) > _WARN_LINES:
            logger.warning("%s: %d more unreadable lines skipped (the last at line %d)",
                           self.path, len(bad) - _WARN_LINES, bad[-1])
        return records


def _after_last_newline(fh: Any, size: int, chunk: int = 64 * 1024) -> int:
    """Offset just after the last ``\\n`` of the open binary file (0 if none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        fh.seek(start)
        i = fh.read(end - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        end = start
    return 0
