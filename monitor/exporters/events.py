"""The alarm event log: append-only JSON Lines of alarm onsets in the state dir.

Each line is one onset with its evidence (``AlarmEvent.to_dict``), fsynced before the
append returns, so a consumer tailing the file never reads half a record.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

EVENTS_NAME = "events.jsonl"


class EventLog:
    """Append-only JSON Lines of alarm onsets (``events.jsonl`` in the state dir)."""

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
