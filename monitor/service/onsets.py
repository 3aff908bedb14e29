"""Alarm onsets recorded once, across restarts.

An alarm episode has a stable id: the stream key, the detector (its alarm key: an
evaluator's detector is ``evaluation:<evaluator>``, so two evaluators' onsets at the same
run are two episodes), the baseline id and the onset's run index within that baseline
(``onset_id``, written with the event). After a ``kill -9`` the monitor resumes from its
last checkpoint and replays the write-ahead log, so the engine sees again the runs
processed between the checkpoint and the kill, and fires again the onsets it fired then.
Before an onset is appended to ``events.jsonl`` the service checks the log's tail (read at
start) and drops it when:

1. its ``onset_id`` is already there (the replay reached the same run: the common case);
2. an onset of the same stream, detector and baseline is recorded at the same or a later
   run index (run indices of one baseline only grow: an earlier one is the replay);
3. it falls within ``alarm_hold_runs`` of an onset of the same stream, detector and
   baseline written *after the checkpoint* and not matched yet: the same episode,
   re-fired a few runs apart because runs that closed in the same instant were processed
   in another order (each such recorded onset matches once).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

from assaywatch.monitor.engine.signals import alarm_key
from assaywatch.monitor.engine.streams import AlarmEvent
from assaywatch.monitor.exporters.events import EventLog

logger = logging.getLogger(__name__)

#: How much of the end of ``events.jsonl`` is read at start (besides everything written
#: since the last checkpoint).
TAIL_BYTES = 4 << 20
#: Onset ids kept in memory.
MAX_IDS = 100_000

Episode = tuple[str, str, str, str, str]


def onset_id(agent: str, version: str, scenario: str, detector: str, baseline_id: str,
             run_index: int) -> str:
    raw = json.dumps([agent, version, scenario, detector, baseline_id, int(run_index)],
                     separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _episode(d: dict[str, Any]) -> Episode:
    """The episode of an onset read back from the event log."""
    return (str(d.get("agent")), str(d.get("version")), str(d.get("scenario")),
            alarm_key(str(d.get("detector")), str(d.get("evaluator") or "")),
            str(d.get("baseline_id")))


def _event_episode(event: AlarmEvent) -> Episode:
    k = event.key
    return (k.agent, k.version, k.scenario, event.alarm_key, event.baseline_id)


class OnsetRecorder:
    """Appends alarm onsets to the event log, each episode once."""

    def __init__(self, events: EventLog, hold_runs: int) -> None:
        self.events = events
        self.hold_runs = hold_runs
        self._ids: dict[str, None] = {}
        self._last: dict[Episode, int] = {}
        self._unmatched: dict[Episode, list[int]] = {}
        self.duplicates = 0

    def offset(self) -> int:
        try:
            return os.path.getsize(self.events.path)
        except OSError:
            return 0

    def load(self, since: int | None) -> None:
        """Read the tail of the event log: everything from ``since`` (the log's size at
        the checkpoint; None without one) and the last TAIL_BYTES. A torn last line (the
        process died inside an append, which therefore never returned) is cut off."""
        path = self.events.path
        try:
            size = os.path.getsize(path)
        except OSError:
            return
        with open(path, "rb+") as fh:
            if size:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    fh.seek(0)
                    data = fh.read()
                    cut = data.rfind(b"\n") + 1
                    logger.warning("%s: a torn last line (%d bytes, written as the process "
                                   "died) was removed", path, size - cut)
                    fh.truncate(cut)
                    size = cut
            start = max(0, size - TAIL_BYTES)
            if since is not None:
                start = min(start, max(0, since))
            fh.seek(start)
            if start:
                fh.readline()  # the first line read may be cut
            while True:
                pos = fh.tell()
                line = fh.readline()
                if not line:
                    break
                try:
                    d = json.loads(line)
                except ValueError:
                    logger.warning("%s: unreadable line at byte %d skipped", path, pos)
                    continue
                if not isinstance(d, dict) or d.get("event") != "alarm":
                    continue
                try:
                    run_index = int(d["run_index"])
                except (KeyError, TypeError, ValueError):
                    continue
                ep = _episode(d)
                self._remember(ep, run_index, d.get("onset_id") or onset_id(*ep, run_index))
                if since is not None and pos >= since:
                    self._unmatched.setdefault(ep, []).append(run_index)

    def _remember(self, ep: Episode, run_index: int, oid: str) -> None:
        self._ids[oid] = None
        if len(self._ids) > MAX_IDS:
            del self._ids[next(iter(self._ids))]
        if self._last.get(ep, 0) < run_index:
            self._last[ep] = run_index

    def is_duplicate(self, event: AlarmEvent, oid: str) -> bool:
        ep = _event_episode(event)
        waiting = self._unmatched.get(ep)
        if oid in self._ids or self._last.get(ep, 0) >= event.run_index:
            if waiting and event.run_index in waiting:
                waiting.remove(event.run_index)
            return True
        if waiting:
            for i, r in enumerate(waiting):
                if abs(event.run_index - r) <= self.hold_runs:
                    del waiting[i]
                    return True
        return False

    def record(self, event: AlarmEvent) -> bool:
        """Append the onset unless it is one already recorded; True when appended."""
        ep = _event_episode(event)
        oid = onset_id(*ep, event.run_index)
        if self.is_duplicate(event, oid):
            self.duplicates += 1
            logger.info("alarm onset %s on %s at run %d is already in the event log "
                        "(replayed after a restart); not recorded again", event.alarm_key,
                        event.key, event.run_index)
            return False
        self.events.append({**event.to_dict(), "onset_id": oid})
        self._remember(ep, event.run_index, oid)
        return True
