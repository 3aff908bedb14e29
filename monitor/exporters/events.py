"""The event log: append-only JSON Lines of alarm onsets and state changes in the state dir.

Each line is one record, fsynced before the append returns, so a consumer tailing the file
never reads half a record. ``"event"`` says which kind:

* ``"alarm"`` - an alarm onset with its evidence (``AlarmEvent.to_dict``);
* ``"rebaseline"`` - a stream told to learn its baseline again over the API
  (``POST /api/rebaseline``, ``assaywatch baseline reset``), with who asked
  (:func:`state_change`: the caller's token id, a hash prefix never the token, and remote
  address) and whether the stream existed.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

EVENTS_NAME = "events.jsonl"


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
    state dir)."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / EVENTS_NAME
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, allow_nan=False, default=str)
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
