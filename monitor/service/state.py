"""Checkpoints of the monitor's state in SQLite (the alarm event log is ``exporters/events.py``).

The checkpoint holds, per stream, the frozen baseline, the detectors' state and the
counters, plus the ingest counters and the write-ahead log positions
(``service/wal.py``); a restart on the same state dir resumes from it and replays the log,
so counts continue and an alarm that was active stays active (no repeated onset).

**What is trusted.** Every item is data: the engine's state (detector objects over numpy
arrays) and the evaluation join are written by ``statecodec.py`` as JSON that names the
allowed state classes and their attributes; reading it rebuilds those classes'
instances, containers and numpy arrays and calls nothing else. The other items are plain
JSON. A checkpoint is also read only when it was written by this state dir's own writer:
``state.key`` (32 random bytes, created mode 0600 at the first checkpoint) keys an
HMAC-SHA256 over the schema and every item, checked before anything is decoded. A
checkpoint without a valid MAC (a file planted in the state dir, a database copied from
elsewhere, a key that others can read or write) is refused: :class:`StateError`, exit 3,
files left as they are; the state dir must be writable only by the monitor's user
(README "Durability").

**Upgrading.** Versions before this one pickled the engine's state (schema 2). Such a
checkpoint is read once, after its MAC is verified, by the allow-listed unpickler
(``safe_pickle.py``: only the same state classes, containers and numpy arrays), and the
next checkpoint is written in the data format; nothing is pickled any more.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any

from assaywatch.monitor.service import safe_pickle, statecodec

logger = logging.getLogger(__name__)

STATE_SCHEMA = 3
#: The schema of earlier versions, whose engine and join items were pickles: read (after
#: the MAC) to upgrade, never written.
PICKLED_SCHEMA = 2
DB_NAME = "state.sqlite"
KEY_NAME = "state.key"
#: Items holding objects (``statecodec.py``); every other item is plain JSON.
OBJECT_ITEMS = frozenset({"engine", "join"})


class StateError(Exception):
    """The state dir cannot be used as it is: the monitor refuses to start (exit 3) and
    leaves the files untouched, so nothing a user may want back is overwritten."""


def _mac(key: bytes, schema: str, rows: list[tuple[str, bytes]]) -> str:
    h = hmac.new(key, b"assaywatch-state\0" + schema.encode() + b"\0", hashlib.sha256)
    for name, value in sorted(rows):
        h.update(name.encode() + b"\0" + len(value).to_bytes(8, "little") + value)
    return h.hexdigest()


class StateStore:
    """``save(items)`` / ``load() -> dict`` in one SQLite file under ``state_dir``."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"state dir {self.dir} cannot be created: "
                             f"{exc.strerror or exc} (is it a file?)") from None
        self.path = self.dir / DB_NAME
        self.key_path = self.dir / KEY_NAME
        self._lock = threading.Lock()
        self._key: bytes | None = None
        if self.path.exists():  # fail at construction on a file that is no database
            try:
                with contextlib.closing(sqlite3.connect(self.path, timeout=10)) as db:
                    db.execute("SELECT name FROM sqlite_master").fetchall()
            except sqlite3.Error as exc:
                raise self._unusable(f"not a readable state database ({exc})") from None

    def _unusable(self, why: str, path: Path | None = None) -> StateError:
        return StateError(f"{path or self.path}: {why}. It was left untouched: move the state "
                          "dir away (or give --state-dir an empty directory) to start fresh")

    def _connect(self) -> sqlite3.Connection:
        """A connection for writing. Reading uses a plain connection: a state dir that is
        refused must be left byte for byte as it was (no journal-mode switch)."""
        db = sqlite3.connect(self.path, timeout=10)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # a committed checkpoint survives power loss
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        db.execute("CREATE TABLE IF NOT EXISTS blobs (name TEXT PRIMARY KEY, value BLOB)")
        return db

    # -- the key -----------------------------------------------------------------------
    def _read_key(self) -> bytes | None:
        try:
            st = os.stat(self.key_path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._unusable(f"cannot read ({exc.strerror})", self.key_path) from None
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise self._unusable(
                f"the state key must be a regular file only its owner can read and write "
                f"(mode 0600; it is {stat.filemode(st.st_mode)}): anyone who can read it can "
                f"forge a checkpoint", self.key_path)
        try:
            key = self.key_path.read_bytes()
        except OSError as exc:
            raise self._unusable(f"cannot read ({exc.strerror})", self.key_path) from None
        if len(key) < 32:
            raise self._unusable("not a state key (too short)", self.key_path)
        return key

    def _writer_key(self) -> bytes:
        if self._key is None:
            key = self._read_key()
            if key is None:
                key = secrets.token_bytes(32)
                fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(key)
                    fh.flush()
                    os.fsync(fh.fileno())
            self._key = key
        return self._key

    # -- save / load -------------------------------------------------------------------
    def save(self, items: dict[str, Any]) -> None:
        """Replace the checkpoint atomically (one transaction): ``engine`` and ``join``
        by ``statecodec``, every other item plain JSON, all under one MAC."""
        self.write(self.encode(items))

    @staticmethod
    def encode(items: dict[str, Any]) -> list[tuple[str, bytes]]:
        """The rows :meth:`save` writes: the part that reads the live objects (the
        monitor calls it under its pipeline lock, and :meth:`write` after)."""
        return [(name, statecodec.dumps(value) if name in OBJECT_ITEMS else
                 json.dumps(value, separators=(",", ":"), allow_nan=False).encode())
                for name, value in items.items()]

    def write(self, rows: list[tuple[str, bytes]]) -> None:
        """Replace the checkpoint with ``rows`` (from :meth:`encode`) in one transaction."""
        schema = str(STATE_SCHEMA)
        mac = _mac(self._writer_key(), schema, rows)
        with self._lock, contextlib.closing(self._connect()) as db, db:
            db.execute("DELETE FROM blobs")
            db.executemany("INSERT INTO blobs (name, value) VALUES (?, ?)", rows)
            db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                           [("schema", schema), ("mac", mac)])

    def load(self) -> dict[str, Any]:
        """The last checkpoint; raises :class:`StateError` when it cannot be read whole or
        was not written by this state dir's writer."""
        if not self.path.exists():
            return {}
        try:
            with self._lock, contextlib.closing(sqlite3.connect(self.path, timeout=10)) as db:
                tables = {r[0] for r in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'")}
                if not {"meta", "blobs"} <= tables:
                    if tables:
                        raise self._unusable("not a state database of the monitor "
                                             f"(tables {sorted(tables)})")
                    return {}
                meta = dict(db.execute("SELECT key, value FROM meta"))
                items = [(str(n), bytes(v)) for n, v in db.execute(
                    "SELECT name, value FROM blobs")]
        except sqlite3.Error as exc:
            raise self._unusable(f"not a readable state database ({exc})") from None
        schema = meta.get("schema")
        if schema is None:
            if items:
                raise self._unusable("checkpoint items without a schema")
            return {}
        if schema not in (str(STATE_SCHEMA), str(PICKLED_SCHEMA)):
            raise self._unusable(f"schema {schema}, and this version reads schemas "
                                 f"{PICKLED_SCHEMA} and {STATE_SCHEMA}")
        key = self._read_key()
        if key is None:
            raise self._unusable(f"a checkpoint but no {KEY_NAME} beside it: it was not "
                                 "written by this state dir's monitor, and is not loaded")
        mac = meta.get("mac") or ""
        if not hmac.compare_digest(mac, _mac(key, schema, items)):
            raise self._unusable(f"the checkpoint's MAC does not match {KEY_NAME}: it was "
                                 "not written by this state dir's monitor (or was altered), "
                                 "and is not loaded")
        self._key = key
        out: dict[str, Any] = {}
        legacy = schema == str(PICKLED_SCHEMA)
        for name, value in items:
            try:
                if name not in OBJECT_ITEMS:
                    out[name] = json.loads(value)
                elif legacy:
                    out[name] = safe_pickle.loads(value)
                else:
                    out[name] = statecodec.loads(value)
            except Exception as exc:
                raise self._unusable(f"checkpoint item {name!r} is unreadable "
                                     f"({type(exc).__name__})") from None
        return out
