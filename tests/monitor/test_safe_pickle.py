"""Checkpoints of earlier versions (schema 2) pickled the engine's state; they are still read,
to upgrade, by an allow-listed unpickler (service/safe_pickle.py): the engine's real state
round-trips and resumes exactly, while a pickle naming anything else (a shell command,
eval, the CLI, a class that touches files) is refused before it runs, even when its MAC is
valid (a leaked key), and the monitor's StateStore says so (exit 3). The current format is
tested in test_state_codec.py."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.service import safe_pickle
from assaywatch.monitor.service import state as state_module
from assaywatch.monitor.service.state import StateError, StateStore
from tests.analyzers.simagent import simulate_runs

KEY = StreamKey("support-agent", "1.0", "refund")
TOOLS = {"search": 0.5, "lookup": 0.3, "calc": 0.2}


#: the engine's configuration of the round trips (here and in test_state_codec.py)
ROUND_TRIP_CFG = DetectorConfig(learn_runs=200, hotelling_window=50, hotelling_every=10)


def engine_round_trip(dumps: Callable[[Any], bytes], loads: Callable[[bytes], Any],
                      before: Callable[[Engine], None] | None = None,
                      ) -> tuple[list[tuple[str, int]], list[tuple[str, int]], bytes]:
    """(alarms of an engine checkpointed by ``dumps`` after 350 of 600 runs and resumed
    from ``loads``, alarms of one engine over all 600 runs, the checkpoint's bytes).
    The last 300 runs pass less often, the last 250 score 0.15 lower; ``before`` is
    applied to the first engine just before its checkpoint is written."""
    rng = np.random.default_rng(5)
    runs = simulate_runs(300, rng, key=KEY, tool_weights=TOOLS)
    runs += simulate_runs(300, rng, key=KEY, tool_weights=TOOLS, pass_rate=0.6)
    runs = [dataclasses.replace(r, scores={"helpfulness": float(rng.uniform(0.5, 1))
                                           - 0.15 * (i >= 350)},
                                labels={"safety": str(rng.choice(["safe", "unsafe"]))})
            for i, r in enumerate(runs)]
    whole = Engine(ROUND_TRIP_CFG)
    expected = [(e.detector, e.run_index) for r in runs for e in whole.process(r)]
    first = Engine(ROUND_TRIP_CFG)
    got = [(e.detector, e.run_index) for r in runs[:350] for e in first.process(r)]
    if before is not None:
        before(first)
    data = dumps(first.checkpoint_state())
    resumed = Engine(ROUND_TRIP_CFG)
    resumed.restore_state(loads(data))
    got += [(e.detector, e.run_index) for r in runs[350:] for e in resumed.process(r)]
    return got, expected, data


def test_the_engines_state_round_trips_and_resumes_with_the_same_alarms() -> None:
    got, expected, _ = engine_round_trip(
        lambda st: pickle.dumps(st, protocol=pickle.HIGHEST_PROTOCOL), safe_pickle.loads)
    assert expected
    assert got == expected


class _Call:
    """Pickles as a call of ``fn(*args)``: what a crafted checkpoint does."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


def test_names_outside_the_allow_list_are_refused_before_they_run(tmp_path: Path) -> None:
    from assaywatch.monitor.commands.cli import main

    marker = tmp_path / "ran"
    crafted = [
        _Call(os.system, f"touch {marker}"),
        _Call(eval, f"open({str(marker)!r}, 'w')"),
        _Call(main, ["--help"]),
        _Call(StateStore, str(marker)),  # a monitor class that creates directories
    ]
    for gadget in crafted:
        data = pickle.dumps({"streams": [gadget]}, protocol=pickle.HIGHEST_PROTOCOL)
        with pytest.raises(safe_pickle.UnsafeState):
            safe_pickle.loads(data)
    assert not marker.exists()
    # names reached through an analyzers module are only its own classes
    assert safe_pickle.allowed("assaywatch.analyzers.baseline", "Baseline")
    assert not safe_pickle.allowed("assaywatch.analyzers.baseline", "np")
    assert not safe_pickle.allowed("assaywatch.analyzers.baseline", "Counter")
    assert not safe_pickle.allowed("assaywatch.analyzers.baseline", "build_baseline")
    assert not safe_pickle.allowed("assaywatch.analyzers.baseline",
                                   "Baseline.from_dict")


def write_with_valid_mac(store: StateStore, schema: int, rows: dict[str, bytes]) -> None:
    """Write a checkpoint as someone holding ``state.key`` could (rows as given)."""
    store.save({"counters": {"a": 1}})  # creates the key and the tables
    items = [(name, value) for name, value in rows.items()]
    mac = state_module._mac(store._writer_key(), str(schema), items)
    with contextlib.closing(sqlite3.connect(store.path)) as db, db:
        db.execute("DELETE FROM blobs")
        db.executemany("INSERT INTO blobs (name, value) VALUES (?, ?)", items)
        db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       [("schema", str(schema)), ("mac", mac)])


def test_an_old_pickled_checkpoint_is_read_to_upgrade(tmp_path: Path) -> None:
    """A schema-2 checkpoint (pickled engine state, valid MAC) loads; the next save writes
    the data format, without a pickle."""
    rng = np.random.default_rng(2)
    eng = Engine(DetectorConfig(learn_runs=50))
    for r in simulate_runs(80, rng, key=KEY, tool_weights=TOOLS):
        eng.process(r)
    store = StateStore(tmp_path / "state")
    write_with_valid_mac(store, 2, {
        "engine": pickle.dumps(eng.checkpoint_state(), protocol=pickle.HIGHEST_PROTOCOL),
        "counters": b'{"a":1}'})
    loaded = StateStore(tmp_path / "state").load()
    resumed = Engine(DetectorConfig(learn_runs=50))
    resumed.restore_state(loaded["engine"])
    assert resumed.stream(KEY) is not None and resumed.stream(KEY).baseline is not None
    store.save({"engine": resumed.checkpoint_state(), "counters": loaded["counters"]})
    with contextlib.closing(sqlite3.connect(store.path)) as db:
        schema = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
        blob = bytes(db.execute("SELECT value FROM blobs WHERE name = 'engine'").fetchone()[0])
    assert schema == str(state_module.STATE_SCHEMA) != "2"
    assert blob[:1] == b"[" and b"\x80" not in blob[:2]  # JSON, not a pickle


def test_a_checkpoint_with_a_valid_mac_but_a_gadget_is_refused(tmp_path: Path) -> None:
    """A leaked ``state.key`` lets someone write a checkpoint the MAC accepts; the gadget
    in it still never runs, the monitor refuses the state (exit 3) and leaves it."""
    marker = tmp_path / "ran"
    store = StateStore(tmp_path / "state")
    write_with_valid_mac(store, 2, {
        "engine": pickle.dumps(_Call(os.system, f"touch {marker}")),
        "counters": b'{"a":1}'})
    before = (tmp_path / "state" / "state.sqlite").read_bytes()
    with pytest.raises(StateError, match="unreadable"):
        StateStore(tmp_path / "state").load()
    assert not marker.exists()
    assert (tmp_path / "state" / "state.sqlite").read_bytes() == before
