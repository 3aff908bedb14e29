"""The monitor service in process: health and readiness, the status page, the JSON API and
re-baselining a stream over HTTP and with ``assaywatch baseline reset``."""

from __future__ import annotations

import hashlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.commands.cli import main
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.service.monitor import Monitor
from tests.analyzers.simagent import simulate_runs

KEY = StreamKey("support-agent", "1.0", "refund")


@pytest.fixture
def monitor() -> Iterator[Monitor]:
    cfg = MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "detectors": {"learn_runs": 50}})
    mon = Monitor(cfg)
    mon.start()
    yield mon
    mon.stop()


def _get(mon: Monitor, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{mon.addresses['metrics']}{path}",
                                    timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _feed(mon: Monitor, n: int) -> None:
    runs = simulate_runs(n, np.random.default_rng(3), key=KEY)
    with mon.pipeline.lock:
        mon.engine.process_closed(runs)


def test_health_readiness_and_status_page(monitor: Monitor) -> None:
    assert _get(monitor, "/healthz") == (200, "ok\n")
    assert _get(monitor, "/readyz")[0] == 200
    _feed(monitor, 60)
    code, page = _get(monitor, "/")
    assert code == 200 and "support-agent" in page and "50 runs (" in page
    code, body = _get(monitor, "/api/streams")
    (stream,) = json.loads(body)["streams"]
    assert stream["runs"] == 60 and stream["baseline"]["runs"] == 50
    assert _get(monitor, "/nope")[0] == 404
    monitor.ready.clear()
    assert _get(monitor, "/readyz")[0] == 503


def test_metrics_answers_say_how_old_their_stream_snapshot_is(monitor: Monitor) -> None:
    # The stream families come from a snapshot at most max_age_s (2 s) old, or one asked
    # for and waited on at most scrape_wait_s: the answer dates it for readers that
    # difference counters over short windows. A run fed after the answer shows up only
    # in a newer snapshot.
    _feed(monitor, 60)
    url = f"http://{monitor.addresses['metrics']}/metrics"
    ages = []
    for _ in range(3):
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read().decode()
            ages.append(float(r.headers["X-Assaywatch-Snapshot-Age"]))
        assert 'assaywatch_runs_total{agent="support-agent"' in body
    assert all(0.0 <= a <= 2.5 for a in ages), ages


def _post(mon: Monitor, body: object, headers: dict[str, str] | None = None,
          raw: bytes | None = None) -> tuple[int, dict[str, object]]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{mon.addresses['metrics']}/api/rebaseline",
                                 method="POST", data=data,
                                 headers={"Content-Type": "application/json",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_rebaseline_over_http_and_cli(stateful: Monitor, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    mon = stateful
    token_file = tmp_path / "state" / "api-token"
    assert token_file.stat().st_mode & 0o777 == 0o600  # created at the first start
    token = token_file.read_text().strip()
    _feed(mon, 60)
    auth = {"Authorization": f"Bearer {token}"}
    code, body = _post(mon, KEY.as_labels(), auth)
    assert code == 200 and body["rebaselined"] is True
    st = mon.engine.stream(KEY)
    assert st is not None and st.baseline is None  # learning again from the next runs
    (event,) = [e for e in mon.events.read() if e["event"] == "rebaseline"]  # type: ignore[union-attr]
    assert event["agent"] == KEY.agent and event["by"]["remote"] == "127.0.0.1"
    assert event["by"]["token_id"] == hashlib.sha256(token.encode()).hexdigest()[:12]
    assert token not in json.dumps(event)
    url = f"http://{mon.addresses['metrics']}"
    state = str(tmp_path / "state")
    assert main(["baseline", "reset", "--url", url, "--state-dir", state, "--agent", KEY.agent,
                 "--version", KEY.version, "--scenario", KEY.scenario]) == 0
    assert main(["baseline", "reset", "--url", url, "--state-dir", state,
                 "--agent", "nobody"]) == 3
    assert "has no stream" in capsys.readouterr().err
    # without the token the CLI says how to give it
    assert main(["baseline", "reset", "--url", url, "--agent", KEY.agent]) == 3
    err = capsys.readouterr().err
    assert "401" in err and "ASSAYWATCH_API_TOKEN" in err


def test_rebaseline_refuses_without_credentials_and_cross_site(stateful: Monitor,
                                                               tmp_path: Path) -> None:
    mon = stateful
    token = (tmp_path / "state" / "api-token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    _feed(mon, 60)
    port = mon.addresses["metrics"].rsplit(":", 1)[1]
    cases = [
        ({}, 401),                                                  # no credentials
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Basic {token}"}, 401),
        ({**auth, "Origin": "http://evil.example"}, 403),           # CSRF from a page
        ({**auth, "Origin": "null"}, 403),
        ({**auth, "Sec-Fetch-Site": "cross-site"}, 403),
        ({**auth, "Host": f"evil.example:{port}"}, 403),            # DNS rebinding
        ({**auth, "Content-Type": "application/x-www-form-urlencoded"}, 415),
        ({**auth, "Content-Type": "text/plain"}, 415),              # a "simple request"
    ]
    for headers, want in cases:
        code, _ = _post(mon, KEY.as_labels(), headers)
        assert code == want, headers
    code, _ = _post(mon, None, auth, raw=b"agent=support-agent")
    assert code == 400
    st = mon.engine.stream(KEY)
    assert st is not None and st.baseline is not None  # nothing refused changed anything
    assert not [e for e in mon.events.read() if e["event"] == "rebaseline"]  # type: ignore[union-attr]
    # the page's own origin and a localhost name are fine
    code, _ = _post(mon, KEY.as_labels(), {**auth, "Origin": f"http://{mon.addresses['metrics']}"})
    assert code == 200
    code, _ = _post(mon, KEY.as_labels(), {**auth, "Host": f"localhost:{port}"})
    assert code == 200
    assert len([e for e in mon.events.read() if e["event"] == "rebaseline"]) == 2  # type: ignore[union-attr]


def test_rebaseline_disabled_without_token_or_state_dir(monitor: Monitor) -> None:
    _feed(monitor, 60)
    code, body = _post(monitor, KEY.as_labels(), {"Authorization": "Bearer anything"})
    assert code == 403
    assert "ASSAYWATCH_API_TOKEN" in str(body["error"]) and "--state-dir" in str(body["error"])
    st = monitor.engine.stream(KEY)
    assert st is not None and st.baseline is not None


def test_api_token_from_environment_and_allowed_hosts(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setenv("ASSAYWATCH_API_TOKEN", "s3cret-token")
    monkeypatch.setenv("ASSAYWATCH_ALLOWED_HOSTS", "assaywatch.monitoring.svc, *.corp.example")
    cfg = MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "detectors": {"learn_runs": 50}, "state_dir": str(tmp_path)})
    mon = Monitor(cfg)
    mon.start()
    try:
        assert not (tmp_path / "api-token").exists()  # the variable wins: no file
        _feed(mon, 60)
        auth = {"Authorization": "Bearer s3cret-token"}
        for host, want in (("assaywatch.monitoring.svc:9464", 200), ("a.corp.example", 200),
                           ("corp.example.evil", 403), ("10.1.2.3:9464", 200)):
            code, _ = _post(mon, KEY.as_labels(), {**auth, "Host": host})
            assert code == want, host
    finally:
        mon.stop()


def test_metrics_port_validates_content_length_and_times_out_slow_bodies(
        monitor: Monitor) -> None:
    host, port = monitor.addresses["metrics"].rsplit(":", 1)
    for length in ("-1", "abc", "99999999999"):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /api/rebaseline HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Authorization: Bearer x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + length.encode() + b"\r\n\r\n")
            t0 = time.monotonic()
            reply = sock.recv(4096)
            assert time.monotonic() - t0 < 5
            assert reply.startswith(b"HTTP/1.1 403")  # disabled here: refused before reading
    assert _get(monitor, "/healthz") == (200, "ok\n")


def test_stop_flushes_pending_runs_and_checkpoints(tmp_path) -> None:
    cfg = MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "state_dir": str(tmp_path)})
    mon = Monitor(cfg)
    mon.start()
    _feed(mon, 5)
    t0 = time.monotonic()
    mon.stop()
    assert time.monotonic() - t0 < 30
    again = Monitor(cfg)
    again.restore()
    st = again.engine.stream(KEY)
    assert st is not None and st.n_runs == 5


# -- durability (monitor/README.md "Durability"): write-ahead log, replay, counters ----------
SPANS_PER_RUN = 6  # tool_agent(): the agent span, three model calls, two tool calls


def _durable_config(state_dir: object, **extra: object) -> MonitorConfig:
    return MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "assembler": {"grace_seconds": 0.2}, "detectors": {"learn_runs": 20},
        "checkpoint_seconds": 3600, "state_dir": str(state_dir), **extra})


def _offer_runs(mon: Monitor, n: int, seed: int) -> list[str]:
    from tests.monitor.spanfactory import SpanFactory, tool_agent

    f = SpanFactory(seed=seed)
    tids = []
    for _ in range(n):
        spans = f.agent_run(tool_agent(), "genai")
        assert mon.pipeline.offer(spans, "otlp_http")
        tids.append(spans[0].trace_id)
    return tids


def _runs(mon: Monitor) -> int:
    return sum(st.n_runs for st in mon.engine.streams())


def _wait_runs(mon: Monitor, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _runs(mon) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _runs(mon) == n


def _crash(mon: Monitor) -> None:
    """As near kill -9 as a test process gets: no drain, no checkpoint."""
    mon.stop(save=False)


def test_wal_round_trips_span_records_without_pickle(tmp_path) -> None:
    from assaywatch.monitor.receivers.spans import SpanEvent, SpanRecord
    from assaywatch.monitor.service.wal import WriteAheadLog, encode_batch

    res = {"service.name": "svc", "host.ids": ("a", "b")}
    spans = [SpanRecord("t" * 32, "s1", "", "root ü \u2603", 1, 2**62, 1, 2, "boom",
                        {"b": b"\x00\xff", "f": float("inf"), "l": (1, 2.5, True, "x"),
                         "m": {"k": (b"z",)}, "n": None, "i": -7},
                        [SpanEvent("ev", 5, {"x": b"1"})], res, "scope"),
             SpanRecord("t" * 32, "s2", "s1", "child", 3, 4, resource=res)]
    wal = WriteAheadLog(tmp_path, segment_bytes=4096, fsync_seconds=0)
    wal.open()
    positions = [wal.append(encode_batch("otlp_grpc", spans))[0] for _ in range(40)]
    assert len(wal.segments()) > 1  # rotated
    wal.close()
    again = WriteAheadLog(tmp_path)
    read = list(again.read_from(positions[3]))
    assert [p for p, _, _ in read] == positions[3:]
    _, receiver, got = read[0]
    assert receiver == "otlp_grpc" and got == spans
    assert got[0].resource is got[1].resource  # shared, as the decoder shares it
    raw = b"".join(p.read_bytes() for p in (tmp_path / "wal").iterdir())
    assert b"\x80\x05" not in raw[:2] and b"cbuiltins" not in raw  # JSON, not pickle


def test_wal_keeps_the_values_orjson_cannot_write(tmp_path) -> None:
    """orjson writes the log's records, except a batch it would write inexactly: a NaN or
    an infinity (orjson writes null), anywhere in the attributes, a lone surrogate or an
    integer beyond 64 bits (orjson refuses them). Each comes back as it went in."""
    from assaywatch.monitor.receivers.spans import SpanEvent, SpanRecord
    from assaywatch.monitor.service.wal import WriteAheadLog, encode_batch
    from tests.monitor.sdkspans import same_values

    def batch(attrs: dict, events: list | None = None) -> list[SpanRecord]:
        return [SpanRecord("a" * 32, "b" * 16, "", "step", 1, 2, 1, 0, "", attrs,
                           events or [], {"service.name": "svc"}, "scope")]

    cases = {
        "plain": batch({"gen_ai.usage.cost": 0.25, "n": 3, "s": "x", "ok": True}),
        "nan": batch({"cost": float("nan"), "n": 3}),
        "inf in an array": batch({"l": (1.5, float("-inf"))}),
        "inf in a map": batch({"m": {"k": float("inf")}}),
        "nan in an event": batch({}, [SpanEvent("ev", 5, {"x": float("nan")})]),
        "lone surrogate": batch({"s": "a\ud800b"}),
        "integer beyond 64 bits": batch({"big": 2**70, "neg": -(2**70)}),
    }
    wal = WriteAheadLog(tmp_path, fsync_seconds=0)
    wal.open()
    for spans in cases.values():
        wal.append(encode_batch("otlp_http", spans))
    wal.close()
    read = [spans for _, _, spans in WriteAheadLog(tmp_path).read_from((0, 0))]
    assert len(read) == len(cases)

    for (name, sent), got in zip(cases.items(), read, strict=True):
        (s,), (g,) = sent, got
        assert same_values(s.attributes, g.attributes), (name, s.attributes, g.attributes)
        assert [same_values(e.attributes, f.attributes) for e, f in zip(s.events, g.events,
                                                                 strict=True)] \
            == [True] * len(s.events), name
        assert (g.trace_id, g.name, g.resource) == (s.trace_id, s.name, s.resource), name


def test_wal_torn_tail_is_skipped(tmp_path) -> None:
    from assaywatch.monitor.service.wal import WriteAheadLog, encode_batch
    from tests.monitor.spanfactory import SpanFactory, tool_agent

    wal = WriteAheadLog(tmp_path, fsync_seconds=-1)
    wal.open()
    batch = SpanFactory(seed=1).agent_run(tool_agent(), "genai")
    for _ in range(3):
        wal.append(encode_batch("otlp_http", batch))
    wal.close()
    (seg,) = (tmp_path / "wal").iterdir()
    data = seg.read_bytes()
    seg.write_bytes(data + data[8:40])  # the header and the start of a 4th record
    assert len(list(WriteAheadLog(tmp_path).read_from((0, 0)))) == 3


def test_kill_replays_acknowledged_spans_and_counts_each_run_once(tmp_path) -> None:
    cfg = _durable_config(tmp_path)
    mon = Monitor(cfg)
    mon.start()
    _offer_runs(mon, 30, seed=1)
    _wait_runs(mon, 30)
    mon.checkpoint()  # 30 runs in the checkpoint; their spans leave the log window
    _offer_runs(mon, 12, seed=2)
    _wait_runs(mon, 42)  # processed after the checkpoint: lost with the process
    _offer_runs(mon, 5, seed=3)  # acknowledged, still pending at the kill
    _crash(mon)
    seg = sorted((tmp_path / "wal").iterdir())[-1]
    with open(seg, "ab") as fh:
        fh.write(b"\x10\x00\x00\x00torn")  # the process died inside a write
    again = Monitor(cfg)
    again.start()
    try:
        assert _runs(again) == 47  # complete runs are closed by the replay itself
        assert again.counters.snapshot()[0] == {"otlp_http": 47 * SPANS_PER_RUN}
        again.checkpoint()
        assert [p.name for p in sorted((tmp_path / "wal").iterdir())] == [
            "0000000000000002.wal"]  # the old segments are behind the low-water mark
    finally:
        again.stop()
    third = Monitor(cfg)
    third.start()
    try:
        assert _runs(third) == 47 and third.replayed_spans == 0
    finally:
        third.stop()


def test_graceful_stop_refuses_new_work_and_leaves_pending_traces_in_the_log(
        tmp_path) -> None:
    from tests.monitor.spanfactory import SpanFactory, tool_agent

    cfg = _durable_config(tmp_path, assembler={"grace_seconds": 30})
    mon = Monitor(cfg)
    mon.start()
    _offer_runs(mon, 4, seed=5)
    unfinished = [s for s in SpanFactory(seed=6).agent_run(tool_agent(), "genai")
                  if s.parent_span_id]  # the agent span has not ended yet
    assert mon.pipeline.offer(unfinished, "otlp_http")
    mon.stop()
    assert not mon.pipeline.offer(SpanFactory(seed=7).agent_run(tool_agent(), "genai"),
                                  "otlp_http")  # 503 / UNAVAILABLE with a retry hint
    assert _runs(mon) == 0  # not closed at the stop: still pending, in the log
    again = Monitor(cfg)
    again.start()
    try:
        assert again.replayed_spans == 5 * SPANS_PER_RUN - 1
        # the complete runs close at once; the unfinished one waits for its agent span
        assert _runs(again) == 4 and again.pipeline.pending_traces() == 1
    finally:
        again.stop()


def test_counters_never_go_backwards_across_a_crash(tmp_path) -> None:
    cfg = _durable_config(tmp_path)
    mon = Monitor(cfg)
    mon.start()
    _offer_runs(mon, 3, seed=7)
    mon.counters.add_received("otlp_http", 3 * SPANS_PER_RUN)  # as the receiver does
    mon.counters.add_rejected("otlp_grpc", "malformed", 2)
    mon.checkpoint()
    mon.counters.add_rejected("otlp_grpc", "malformed", 5)  # after the checkpoint...
    mon.counters.add_sanitised("otlp_grpc", "invalid_utf8", 4)
    exported = mon.counters.snapshot(), mon.counters.sanitised_snapshot()  # ...scraped
    _crash(mon)
    again = Monitor(cfg)
    again.start()
    try:
        received, rejected, _ = again.counters.snapshot()
        assert received["otlp_http"] >= exported[0][0]["otlp_http"] == 3 * SPANS_PER_RUN
        assert rejected[("otlp_grpc", "malformed")] >= 7
        assert again.counters.sanitised_snapshot()[("otlp_grpc", "invalid_utf8")] >= 4
    finally:
        again.stop()


def test_a_replayed_alarm_onset_is_recorded_once(tmp_path) -> None:
    from assaywatch.monitor.engine.streams import AlarmEvent
    from assaywatch.monitor.exporters.events import EventLog
    from assaywatch.monitor.service.onsets import OnsetRecorder

    def onset(run_index: int, detector: str = "sprt") -> AlarmEvent:
        return AlarmEvent(KEY, detector, run_index, run_index + 50, f"r{run_index}", "r0",
                          "b1", {"llr": 3.0})

    log = EventLog(tmp_path)
    first = OnsetRecorder(log, hold_runs=200)
    first.load(None)
    since = first.offset()  # the checkpoint
    assert first.record(onset(40))
    with open(log.path, "a") as fh:
        fh.write('{"event": "alarm", "agent": "torn')  # died inside an append
    after = OnsetRecorder(log, hold_runs=200)
    after.load(since)
    assert not after.record(onset(40))  # the replay fires it again: same id
    assert not after.record(onset(12))  # an onset before a recorded one: the replay
    assert after.record(onset(45, "hotelling"))
    assert after.record(onset(300))  # a later episode
    lines = [json.loads(x) for x in log.path.read_text().splitlines()]
    assert [(e["detector"], e["run_index"]) for e in lines] == [
        ("sprt", 40), ("hotelling", 45), ("sprt", 300)]
    assert len({e["onset_id"] for e in lines}) == 3


def test_two_evaluators_alarming_on_one_run_are_two_onsets_also_after_a_restart(
        tmp_path) -> None:
    from assaywatch.monitor.engine.streams import AlarmEvent
    from assaywatch.monitor.exporters.events import EventLog
    from assaywatch.monitor.service.onsets import OnsetRecorder

    def onset(evaluator: str) -> AlarmEvent:
        # one late evaluation carrying two dropped scores: both alarms at run index 120
        return AlarmEvent(KEY, "evaluation", 120, 170, "r120", "r0", "b1",
                          {"statistic": 9.0}, evaluator=evaluator)

    log = EventLog(tmp_path)
    first = OnsetRecorder(log, hold_runs=200)
    first.load(None)
    since = first.offset()
    assert first.record(onset("helpfulness"))
    assert first.record(onset("groundedness"))  # another watch: its own episode
    after = OnsetRecorder(log, hold_runs=200)
    after.load(since)
    assert not after.record(onset("helpfulness"))  # the replay: each recorded once
    assert not after.record(onset("groundedness"))
    lines = [json.loads(x) for x in log.path.read_text().splitlines()]
    assert [(e["detector"], e["evaluator"]) for e in lines] == [
        ("evaluation", "helpfulness"), ("evaluation", "groundedness")]
    assert len({e["onset_id"] for e in lines}) == 2


def test_a_checkpoint_not_written_by_the_state_dirs_writer_is_refused(tmp_path) -> None:
    import os

    from assaywatch.monitor.service.state import StateError, StateStore

    store = StateStore(tmp_path)
    store.save({"engine": ({}, {}, {}), "counters": {"received": {}}})
    assert StateStore(tmp_path).load()["counters"] == {"received": {}}
    assert os.stat(tmp_path / "state.key").st_mode & 0o777 == 0o600
    other = tmp_path / "other"
    StateStore(other).save({"engine": ({}, {}, {"x": 1})})
    os.replace(other / "state.sqlite", tmp_path / "state.sqlite")  # valid, foreign key
    with pytest.raises(StateError, match="MAC does not match"):
        StateStore(tmp_path).load()
    os.chmod(tmp_path / "state.key", 0o644)
    with pytest.raises(StateError, match="mode 0600"):
        StateStore(tmp_path).load()


def _evaluations(mon: Monitor, evaluator: str = "helpfulness") -> int:
    return sum(st.evaluators[evaluator].count for st in mon.engine.streams()
               if evaluator in st.evaluators)


def test_a_late_evaluation_acknowledged_before_a_kill_is_counted_once(tmp_path) -> None:
    """Evaluations arriving after their run closed survive a kill -9 like spans: those
    the engine had before the checkpoint are not applied twice, those after it are
    replayed from the log, and the checkpoint keeps the join's digests across a restart."""
    from assaywatch.monitor.receivers.spans import evaluation_record

    def judge(tid: str, score: float) -> list:
        return [evaluation_record(tid, "", 0, {"gen_ai.evaluation.name": "helpfulness",
                                               "gen_ai.evaluation.score.value": score},
                                  {"service.name": "judge"})]

    cfg = _durable_config(tmp_path)
    mon = Monitor(cfg)
    mon.start()
    tids = _offer_runs(mon, 10, seed=7)
    _wait_runs(mon, 10)
    for tid in tids[:4]:  # late: their runs closed
        assert mon.pipeline.offer(judge(tid, 0.9), "otlp_http")
    deadline = time.monotonic() + 10
    while _evaluations(mon) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _evaluations(mon) == 4
    mon.checkpoint()
    for tid in tids[4:7]:  # after the checkpoint: replayed from the log after the kill
        assert mon.pipeline.offer(judge(tid, 0.8), "otlp_http")
    _crash(mon)
    again = Monitor(cfg)
    again.start()
    try:
        assert _evaluations(again) == 7
        for tid in tids[7:]:  # the digests came back with the checkpoint: still joined
            assert again.pipeline.offer(judge(tid, 0.7), "otlp_http")
        deadline = time.monotonic() + 10
        while _evaluations(again) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _evaluations(again) == 10
        assert again.pipeline.assembler.join.counts["late"] >= 6
        # evaluation records are log records, not spans
        assert again.counters.snapshot()[0] == {"otlp_http": 10 * SPANS_PER_RUN}
    finally:
        again.stop()


def test_classified_spans_keep_attributes_only_for_the_write_ahead_log(tmp_path) -> None:
    """A monitor without a state dir decodes with ``classified_attributes=False`` (nothing
    reads a classified span's attributes after the decoder); with one, the write-ahead log
    replays them after a crash, so they are kept."""
    listen = {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"}
    lean = Monitor(MonitorConfig.from_mapping({"listen": listen}))
    durable = Monitor(MonitorConfig.from_mapping({"listen": listen,
                                                  "state_dir": str(tmp_path)}))
    assert lean.wal is None and durable.wal is not None
    assert lean.decode_limits().classified_attributes is False
    assert durable.decode_limits().classified_attributes is True
    # both read the same keys and classify while decoding
    assert lean.decode_limits().keep_keys == durable.decode_limits().keep_keys
    assert lean.decode_limits().classify is not None
