"""The checkpoint's data format (service/statecodec.py): the engine's real state round-trips
and resumes with the same alarms; values keep their types, sharing and cycles; data naming
anything outside the allow-list (a shell command, eval, a class that touches files) is
refused without running it, even behind a valid MAC (a leaked key), and the StateStore
says so (exit 3) and leaves the file as it was."""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from collections import Counter, OrderedDict, defaultdict, deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import StreamState
from assaywatch.monitor.service import state as state_module
from assaywatch.monitor.service import statecodec
from assaywatch.monitor.service.state import StateError, StateStore
from assaywatch.monitor.service.statecodec import StateDecodeError
from tests.analyzers.simagent import simulate_runs
from tests.monitor.test_safe_pickle import ROUND_TRIP_CFG, engine_round_trip, write_with_valid_mac

KEY = StreamKey("support-agent", "1.0", "refund")
TOOLS = {"search": 0.5, "lookup": 0.3, "calc": 0.2}


def test_the_engines_state_round_trips_and_resumes_with_the_same_alarms() -> None:
    got, expected, data = engine_round_trip(statecodec.dumps, statecodec.loads)
    assert expected
    assert data.isascii() and data[:1] == b"["
    assert got == expected
    # and the resumed state writes the same bytes again
    again = Engine(ROUND_TRIP_CFG)
    again.restore_state(statecodec.loads(data))
    assert statecodec.dumps(again.checkpoint_state()) == data


def test_values_keep_their_types_sharing_and_cycles() -> None:
    shared = [1, 2]
    cyc: list[Any] = ["loop"]
    cyc.append(cyc)
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    value = {
        "floats": [0.1, -0.0, math.inf, -math.inf, 1e308, 5e-324],
        "big": 2**80, "neg": -(2**70), "surrogate": "bad \ud800 name", "unicode": "é中",
        "bytes": b"\x00\xff", "complex": 1 + 2j, "tuple": (1, ("a", None), True),
        "sets": {1, 2}, "frozen": frozenset({"x"}), "deque": deque([1, 2, 3], maxlen=5),
        "od": OrderedDict([("b", 1), ("a", 2)]), "ctr": Counter({"a": 3}),
        "dd": defaultdict(list, {"k": [1]}), "keys": {(1, "a"): "tuple key", 3: "int key"},
        "np_scalar": np.float64(0.5), "np_int": np.int64(-3), "np_bool": np.bool_(True),
        "arr": arr, "arr_t": arr.T, "zero_d": np.array(7, dtype=np.int16),
        "empty": np.zeros((0, 3)), "dtype": np.dtype("<u4"),
        "shared_a": shared, "shared_b": shared, "cycle": cyc,
        "stream_key": KEY,
    }
    got = statecodec.loads(statecodec.dumps(value))
    assert got["floats"][:3] == [0.1, -0.0, math.inf] and math.copysign(1, got["floats"][1]) < 0
    assert got["floats"][3:] == [-math.inf, 1e308, 5e-324]
    assert math.isnan(statecodec.loads(statecodec.dumps(math.nan)))
    assert got["big"] == 2**80 and got["neg"] == -(2**70)
    assert got["surrogate"] == "bad \ud800 name" and got["unicode"] == "é中"
    assert got["bytes"] == b"\x00\xff" and got["complex"] == 1 + 2j
    assert got["tuple"] == (1, ("a", None), True) and type(got["tuple"][1]) is tuple
    assert got["sets"] == {1, 2} and got["frozen"] == frozenset({"x"})
    assert type(got["deque"]) is deque and got["deque"].maxlen == 5
    assert list(got["deque"]) == [1, 2, 3]
    assert type(got["od"]) is OrderedDict and list(got["od"]) == ["b", "a"]
    assert type(got["ctr"]) is Counter and got["ctr"]["a"] == 3 and got["ctr"]["z"] == 0
    assert got["dd"]["new"] == [] and got["dd"]["k"] == [1]
    assert got["keys"] == {(1, "a"): "tuple key", 3: "int key"}
    assert type(got["np_scalar"]) is np.float64 and got["np_scalar"] == 0.5
    assert type(got["np_int"]) is np.int64 and got["np_int"] == -3
    assert type(got["np_bool"]) is np.bool_
    assert got["arr"].dtype == np.float32 and np.array_equal(got["arr"], arr)
    assert np.array_equal(got["arr_t"], arr.T) and got["zero_d"].shape == ()
    assert int(got["zero_d"]) == 7 and got["empty"].shape == (0, 3)
    assert got["dtype"] == np.dtype("<u4")
    assert got["shared_a"] is got["shared_b"]
    assert got["cycle"][1] is got["cycle"]
    assert got["stream_key"] == KEY and hash(got["stream_key"]) == hash(KEY)


def test_a_generator_continues_its_stream() -> None:
    rng = np.random.default_rng(11)
    rng.random(5)
    copy = statecodec.loads(statecodec.dumps(rng))
    assert np.array_equal(copy.random(4), rng.random(4))


def _layout_before_watches(eng: Engine) -> None:
    """Each stream as checkpoints held it before watches (engine/signals.py): the SPRT and
    the CUSUMs in ``detectors`` by name, each evaluator's detector on its EvaluatorState."""
    for st in eng.streams():
        d = st.__dict__
        watches, sprt = d.pop("watches"), d.pop("sprt")
        d["detectors"] = {**({"sprt": sprt} if sprt is not None else {}),
                          **{n: w.detector for n, w in watches.items() if ":" not in n}}
        for ev in st.evaluators.values():
            w = watches.get(f"evaluation:{ev.name}")
            ev.__dict__["detector"] = None if w is None else w.detector


def test_a_checkpoint_from_before_watches_resumes_with_the_same_alarms() -> None:
    got, expected, data = engine_round_trip(statecodec.dumps, statecodec.loads,
                                            before=_layout_before_watches)
    assert b'"detectors"' in data and b'"watches"' not in data  # the old layout was written
    # the pass rate and the evaluator alarm after the restore (at run index 150)
    assert {d for d, i in expected if i > 150} >= {"cusum_pass_rate", "evaluation"}
    assert got == expected
    resumed = Engine(ROUND_TRIP_CFG)
    resumed.restore_state(statecodec.loads(data))
    (st,) = resumed.streams()
    assert st.sprt is not None and "detectors" not in st.__dict__
    assert set(st.watches) == {"cusum_pass_rate", "cusum_fingerprint",
                               "evaluation:helpfulness", "evaluation:safety"}
    assert all("detector" not in ev.__dict__ for ev in st.evaluators.values())


def test_a_dataclass_from_an_older_checkpoint_gets_its_new_fields_defaults() -> None:
    st = StreamState(KEY)
    tree = json.loads(statecodec.dumps(st))
    i = tree.index("last_seen_ns")  # written as: name, value
    del tree[i:i + 2]
    got = statecodec.loads(json.dumps(tree).encode())
    assert isinstance(got, StreamState) and got.last_seen_ns == 0 and got.key == KEY


def test_a_value_the_state_never_holds_is_refused_when_writing() -> None:
    class Local:
        pass

    for bad in (Local(), open, lambda: 1, np.array([object()], dtype=object)):
        with pytest.raises(TypeError):
            statecodec.dumps({"x": bad})


CRAFTED = [
    ["o", "os:system", "command", "touch MARKER"],
    ["fn", "builtins:eval"],
    ["fn", "os:system"],
    ["o", "assaywatch.monitor.service.state:StateStore", "dir", "MARKER"],
    ["o", "assaywatch.monitor.commands.cli:main"],
    ["e", "subprocess:Popen", "touch MARKER"],
    ["dd", "builtins:eval", "a", 1],
    ["dd", "os:system", "a", 1],
    ["o", "assaywatch.analyzers.model:StreamKey", "__class__", "x"],
    ["o", "assaywatch.analyzers.baseline:Baseline.from_dict"],
    ["gen", "os", {}],
    ["nd", "|O", [1], "AAAAAAAAAAA="],
    ["r", 0],
    ["zz"],
    {"a": 1},
]


@pytest.mark.parametrize("tree", CRAFTED, ids=[json.dumps(t)[:40] for t in CRAFTED])
def test_crafted_data_is_refused_without_running(tmp_path: Path, tree: Any) -> None:
    marker = tmp_path / "ran"
    data = json.dumps(tree).replace("MARKER", str(marker)).encode()
    with pytest.raises(StateDecodeError):
        statecodec.loads(data)
    assert not marker.exists()


def test_a_checkpoint_with_a_valid_mac_but_crafted_data_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    store = StateStore(tmp_path / "state")
    crafted = json.dumps(["t", ["o", "os:system", "command", f"touch {marker}"]]).encode()
    write_with_valid_mac(store, state_module.STATE_SCHEMA,
                         {"engine": crafted, "counters": b'{"a":1}'})
    before = store.path.read_bytes()
    with pytest.raises(StateError, match="unreadable"):
        StateStore(tmp_path / "state").load()
    assert not marker.exists()
    assert store.path.read_bytes() == before


def test_the_store_writes_no_pickle(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    eng = Engine(DetectorConfig(learn_runs=50))
    for r in simulate_runs(80, rng, key=KEY, tool_weights=TOOLS):
        eng.process(r)
    store = StateStore(tmp_path / "state")
    store.save({"engine": eng.checkpoint_state(), "counters": {"a": 1}})
    with contextlib.closing(sqlite3.connect(store.path)) as db:
        blobs = dict(db.execute("SELECT name, value FROM blobs"))
    for blob in blobs.values():
        json.loads(blob)  # every item is JSON
    loaded = StateStore(tmp_path / "state").load()
    resumed = Engine(DetectorConfig(learn_runs=50))
    resumed.restore_state(loaded["engine"])
    st = resumed.stream(KEY)
    assert st is not None and st.baseline is not None
    assert st.baseline.n_runs == eng.stream(KEY).baseline.n_runs == 50
