"""Ingest counters that never go backwards across restarts.

Prometheus reads a counter that decreases as a reset, so ``rate()`` and ``increase()``
jump. After a ``kill -9`` the monitor restarts from its last checkpoint, and some counts
happened after it. How each family is kept monotone:

* ``received``: a span is counted by the receiver only *after* ``Pipeline.offer`` wrote
  it to the write-ahead log. The checkpoint stores the spans acknowledged per receiver
  together with the log end, taken under one lock; a restart adds every record after that
  end. So the restored count is every span ever written to the log, which is at least
  anything a scrape saw before the kill.
* ``dropped``: restored from the checkpoint, then advanced again by the replay of the log
  (the same spans meet the same assembler limits).
* ``rejected`` and ``sanitised`` happen at the edge, on requests that never reach the log,
  so the replay cannot recount them.

And for all four, a floor: :meth:`DurableCounters.snapshot` (what the Prometheus collector
reads) writes the values it returns to ``counters.json`` in the state dir *before*
returning them, and never returns less than that file held at start. Whatever a scrape
exported is therefore on disk (``os.replace`` of a fully written file: it survives a
process crash) and the next process starts from it. The floor only guards the exported
value; the live counts underneath keep their own arithmetic, so a count the replay
repeats (a ``dropped`` reason between the checkpoint and the kill) can export a little
high, never low.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from assaywatch.monitor.receivers.spans import IngestCounters

logger = logging.getLogger(__name__)

COUNTERS_NAME = "counters.json"

_Pairs = dict[tuple[str, str], int]
_Four = tuple[dict[str, int], _Pairs, dict[str, int], _Pairs]


def _max1(live: dict[str, int], floor: dict[str, int]) -> dict[str, int]:
    if not floor:
        return live
    out = dict(live)
    for k, v in floor.items():
        if out.get(k, 0) < v:
            out[k] = v
    return out


def _max2(live: _Pairs, floor: _Pairs) -> _Pairs:
    if not floor:
        return live
    out = dict(live)
    for k, v in floor.items():
        if out.get(k, 0) < v:
            out[k] = v
    return out


def pairs_to_json(d: _Pairs) -> list[list[Any]]:
    return [[a, b, n] for (a, b), n in sorted(d.items())]


def pairs_from_json(rows: Any, what: str) -> _Pairs:
    out: _Pairs = {}
    for row in rows:
        a, b, n = row
        if not (isinstance(a, str) and isinstance(b, str) and isinstance(n, int)):
            raise ValueError(f"{what}: bad entry {row!r}")
        out[(a, b)] = n
    return out


def counts_from_json(d: Any, what: str) -> dict[str, int]:
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, int)
                                          and not isinstance(v, bool) for k, v in d.items()):
        raise ValueError(f"{what}: not a mapping of names to integers")
    return dict(d)


class DurableCounters(IngestCounters):
    """:class:`IngestCounters` whose exported values are persisted before they are
    exported and never fall below what a previous process exported (module docstring)."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(state_dir) / COUNTERS_NAME
        self._plock = threading.Lock()
        self._written: Any = None
        self._last_out: _Four | None = None
        self.floor_received: dict[str, int] = {}
        self.floor_dropped: dict[str, int] = {}
        self.floor_rejected: _Pairs = {}
        self.floor_sanitised: _Pairs = {}

    def load_floor(self) -> None:
        """Read ``counters.json``; raises ValueError (the caller's StateError) when it is
        there but not ours."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        self.floor_received = counts_from_json(data.get("received", {}), "received")
        self.floor_dropped = counts_from_json(data.get("dropped", {}), "dropped")
        self.floor_rejected = pairs_from_json(data.get("rejected", []), "rejected")
        self.floor_sanitised = pairs_from_json(data.get("sanitised", []), "sanitised")

    def live_snapshot(self) -> _Four:
        """The counts of this process (restored and advanced), without the floor."""
        received, rejected, dropped = super().snapshot()
        return received, rejected, dropped, super().sanitised_snapshot()

    def _exported(self) -> _Four:
        received, rejected, dropped, sanitised = self.live_snapshot()
        out = (_max1(received, self.floor_received), _max2(rejected, self.floor_rejected),
               _max1(dropped, self.floor_dropped), _max2(sanitised, self.floor_sanitised))
        return self._persist(out)

    def _persist(self, out: _Four) -> _Four:
        """Write ``out`` and return it; when it cannot be written, return the last values
        that were (exported values must be on disk, and must not decrease)."""
        doc = {"received": out[0], "rejected": pairs_to_json(out[1]), "dropped": out[2],
               "sanitised": pairs_to_json(out[3])}
        with self._plock:
            if doc == self._written:
                return out
            tmp = self.path.with_name(self.path.name + ".tmp")
            try:
                with open(tmp, "w", encoding="utf-8") as fh:
                    json.dump(doc, fh, sort_keys=True)
                os.replace(tmp, self.path)
            except OSError:
                logger.exception("cannot write %s; exporting the last values written",
                                 self.path)
                return self._last_out or (self.floor_received, self.floor_rejected,
                                          self.floor_dropped, self.floor_sanitised)
            self._written = doc
            self._last_out = out
            return out

    def snapshot(self) -> tuple[dict[str, int], _Pairs, dict[str, int]]:
        received, rejected, dropped, _ = self._exported()
        return received, rejected, dropped

    def sanitised_snapshot(self) -> _Pairs:
        return self._exported()[3]
