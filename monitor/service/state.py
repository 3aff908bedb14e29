"""Checkpoints of the monitor's state in SQLite (the alarm event log is ``exporters/events.py``).

The checkpoint holds, per stream, the frozen baseline, the detectors' state and the
counters, plus the ingest counters; a restart on the same state dir resumes from it, so
counts continue and an alarm that was active stays active (no repeated onset). The
detector objects are stored with ``pickle`` (they are our own plain classes over numpy
arrays, written and read only by this process's own state dir); a checkpoint from an
incompatible version is reported and ignored rather than half-loaded.
"""

from __future__ import annotations

import logging
import os
import pickle
import sqlite3
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STATE_SCHEMA = 1
DB_NAME = "state.sqlite"


class StateError(Exception):
    """The state dir cannot be used as it is: the monitor refuses to start (exit 3) and
    leaves the files untouched, so nothing a user may want back is overwritten."""


class StateStore:
    """``save(blob_by_name)`` / ``load() -> dict`` in one SQLite file under ``state_dir``."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"state dir {self.dir} cannot be created: "
                             f"{exc.strerror or exc} (is it a file?)") from None
        self.path = self.dir / DB_NAME
        self._lock = threading.Lock()
        try:
            with self._connect() as db:
                db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
                db.execute("CREATE TABLE IF NOT EXISTS blobs (name TEXT PRIMARY KEY, "
                           "value BLOB)")
        except sqlite3.Error as exc:
            raise self._unusable(f"not a readable state database ({exc})") from None

    def _unusable(self, why: str) -> StateError:
        return StateError(f"{self.path}: {why}. It was left untouched: move the state dir "
                          "away (or give --state-dir an empty directory) to start fresh")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def save(self, items: dict[str, Any]) -> None:
        """Replace the checkpoint atomically (one transaction)."""
        rows = [(name, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
                for name, value in items.items()]
        with self._lock, self._connect() as db:
            db.execute("DELETE FROM blobs")
            db.executemany("INSERT INTO blobs (name, value) VALUES (?, ?)", rows)
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)",
                       (str(STATE_SCHEMA),))

    def load(self) -> dict[str, Any]:
        """The last checkpoint; raises :class:`StateError` when it cannot be read whole."""
        try:
            with self._lock, self._connect() as db:
                row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
                if row is None:
                    return {}
                if row[0] != str(STATE_SCHEMA):
                    raise self._unusable(f"schema {row[0]}, and this version reads schema "
                                         f"{STATE_SCHEMA}")
                items = list(db.execute("SELECT name, value FROM blobs"))
        except sqlite3.Error as exc:
            raise self._unusable(f"not a readable state database ({exc})") from None
        out: dict[str, Any] = {}
        for name, value in items:
            try:
                out[name] = pickle.loads(value)
            except Exception as exc:
                raise self._unusable(f"checkpoint item {name!r} is unreadable "
                                     f"({type(exc).__name__})") from None
        return out
