"""Streams do not live forever (issue 15, isolation): an idle stream expires, a stream can be
deleted over the authenticated API (and with ``assaywatch baseline delete``), and at the
stream limit a new stream may take the place of an idle one, never of an active one.
Idleness goes by the runs' end times (data time), so a replay removes what the live
monitor removed."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from assaywatch.analyzers.model import Run, StreamKey
from assaywatch.monitor.commands.cli import main
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.service import statecodec
from assaywatch.monitor.service.monitor import Monitor
from tests.analyzers.simagent import simulate_runs

S = 1_000_000_000  # ns per second
A, B, C = StreamKey("a", "1", "s"), StreamKey("b", "1", "s"), StreamKey("junk", "", "")


def _runs(key: StreamKey, times_s: list[float], seed: int = 3) -> list[Run]:
    """Runs of ``key`` ending at the given seconds (data time)."""
    base = simulate_runs(len(times_s), np.random.default_rng(seed), key=key)
    return [dataclasses.replace(r, key=key, start_ns=int(t * S) - S, end_ns=int(t * S))
            for r, t in zip(base, times_s, strict=True)]


def _feed(engine: Engine, *streams: list[Run]) -> None:
    runs = sorted((r for rs in streams for r in rs), key=lambda r: (r.end_ns, r.run_id))
    for r in runs:
        engine.process(r)


def test_in_a_replay_an_idle_stream_expires_by_data_time_and_comes_back() -> None:
    engine = Engine(DetectorConfig(learn_runs=20), stream_idle_seconds=3600)
    # a runs for 100 s then stops; b keeps running for 2 hours
    _feed(engine, _runs(A, [1.0 + i for i in range(100)]),
          _runs(B, [1.0 + 60 * i for i in range(121)], seed=4))
    assert engine.stream(A) is None and engine.stream(B) is not None
    assert engine.removed == {"idle": 1}
    # a's runs after its expiry start a new stream (counts from zero) that starts from
    # a's last frozen baseline, as a new version of an agent does
    frozen = engine._latest_frozen[("a", "s")]
    _feed(engine, _runs(A, [7300.0, 7301.0]))
    st = engine.stream(A)
    assert st is not None and st.n_runs == 2 and st.monitored_runs == 2
    assert st.baseline is frozen and st.baseline_origin == "previous-version"


def test_the_monitor_goes_by_the_wall_clock_so_skewed_senders_do_not_expire_others() -> None:
    """Live (``idle_clock`` = the wall clock): a sender whose spans are 12 days ahead of
    another's does not make the other's stream idle; a stream with no run for the idle
    time of wall clock does expire."""
    wall = [10**18]
    engine = Engine(DetectorConfig(learn_runs=20), stream_idle_seconds=3600,
                    idle_clock=lambda: wall[0])
    _feed(engine, _runs(A, [1.0 + i for i in range(30)]))
    _feed(engine, _runs(B, [12 * 86400.0 + i for i in range(30)], seed=4))
    assert engine.stream(A) is not None and not engine.removed
    wall[0] += 1800 * S  # b runs again half an hour later, and an hour later; a not
    _feed(engine, _runs(B, [12 * 86400.0 + 100], seed=5))
    wall[0] += 1801 * S
    _feed(engine, _runs(B, [12 * 86400.0 + 200], seed=6))
    assert engine.stream(A) is None and engine.removed == {"idle": 1}


def test_nothing_expires_while_every_stream_is_active_or_expiry_is_off() -> None:
    for idle in (0.0, 3600.0):
        engine = Engine(DetectorConfig(learn_runs=20), stream_idle_seconds=idle)
        _feed(engine, _runs(A, [1.0 + 60 * i for i in range(200)]),
              _runs(B, [2.0 + 60 * i for i in range(200)], seed=4))
        assert engine.stream(A) is not None and engine.stream(B) is not None
        assert not engine.removed


def test_at_the_limit_a_new_stream_takes_only_an_idle_streams_place() -> None:
    engine = Engine(DetectorConfig(learn_runs=20), max_streams=2, replace_idle_seconds=600)
    _feed(engine, _runs(A, [1.0, 2.0, 3.0]), _runs(B, [1.5, 2.5, 3.5, 400.0], seed=4))
    # both active within 600 s: the junk stream's runs are dropped
    _feed(engine, _runs(C, [500.0, 501.0], seed=5))
    assert engine.stream(C) is None and engine.dropped["stream_limit"] == 2
    assert not engine.removed
    # a has been idle 600 s (its last run at 3 s) when junk comes again: junk takes a's
    # place, b (active at 400 s) stays
    _feed(engine, _runs(C, [700.0], seed=6))
    assert engine.stream(C) is not None and engine.stream(A) is None
    assert engine.stream(B) is not None and engine.removed == {"replaced": 1}


def test_removals_survive_a_checkpoint() -> None:
    engine = Engine(DetectorConfig(learn_runs=20), stream_idle_seconds=60)
    _feed(engine, _runs(A, [1.0]), _runs(B, [1.0 + i for i in range(100)], seed=4))
    assert engine.removed == {"idle": 1}
    again = Engine(DetectorConfig(learn_runs=20), stream_idle_seconds=60)
    again.restore_state(statecodec.loads(statecodec.dumps(engine.checkpoint_state())))
    assert again.removed == {"idle": 1} and again.now_ns == engine.now_ns
    assert again.stream(B) is not None and again.stream(A) is None
    # the restored order is by activity: b, the only stream, expires after 60 idle s
    _feed(again, _runs(C, [200.0], seed=5))
    assert again.stream(B) is None and again.removed == {"idle": 2}


def _delete(mon: Monitor, key: StreamKey, token: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://{mon.addresses['metrics']}/api/streams/delete",
                                 method="POST", data=json.dumps(key.as_labels()).encode(),
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.load(r)["deleted"] is True
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _metrics(mon: Monitor) -> str:
    with urllib.request.urlopen(f"http://{mon.addresses['metrics']}/metrics",
                                timeout=10) as r:
        return r.read().decode()


def test_delete_over_the_api_needs_the_token_and_is_logged(
        stateful: Monitor, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mon = stateful
    token = (tmp_path / "state" / "api-token").read_text().strip()
    with mon.pipeline.lock:
        _feed(mon.engine, _runs(A, [1.0 + i for i in range(30)]),
              _runs(B, [1.5 + i for i in range(30)], seed=4))
    assert 'agent="a"' in _metrics(mon)
    assert _delete(mon, A, None) == 401
    assert mon.engine.stream(A) is not None
    assert _delete(mon, A, token) == 200
    assert mon.engine.stream(A) is None and mon.engine.stream(B) is not None
    assert _delete(mon, A, token) == 404
    text = _metrics(mon)
    assert 'agent="a"' not in text and 'agent="b"' in text
    assert 'assaywatch_streams_removed_total{reason="deleted"} 1' in text
    (event,) = [e for e in mon.events.read()  # type: ignore[union-attr]
                if e["event"] == "stream_deleted"]
    assert event["agent"] == "a" and event["deleted"] is True
    # the CLI, with the token from the state dir
    url = f"http://{mon.addresses['metrics']}"
    state = str(tmp_path / "state")
    assert main(["baseline", "delete", "--url", url, "--state-dir", state, "--agent", "b",
                 "--version", "1", "--scenario", "s"]) == 0
    assert mon.engine.stream(B) is None
    assert main(["baseline", "delete", "--url", url, "--state-dir", state,
                 "--agent", "b", "--version", "1", "--scenario", "s"]) == 3
    assert "has no stream" in capsys.readouterr().err
