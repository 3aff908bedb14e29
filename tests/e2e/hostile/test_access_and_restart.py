"""Access to the state-changing API of a real monitor process, and the lone-surrogate
poison across a restart on the same state dir.

* CSRF, DNS rebinding and token cases against ``POST /api/rebaseline``: none changes the
  stream; the one with the token (given by ``assaywatch baseline reset --state-dir``) does
  and leaves an event with who asked.
* A lone surrogate in agent, version and scenario, sent once over OTLP/JSON: every scrape
  answers 200 and the other stream is intact, before and after a restart; and a state dir
  already holding such a stream (written by a version without the repair) still scrapes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.service.monitor import Monitor
from tests.analyzers.simagent import simulate_runs
from tests.e2e.hostile.harness import (
    Bystander,
    counter,
    get,
    metrics_ok,
    run_spans,
    write_config,
)
from tests.e2e.otel_agent import MonitorProcess
from tests.e2e.rawotlp import JSON, OtlpHttp, json_bytes, scrape, wait_for

pytestmark = [pytest.mark.e2e]


def _post(mon: MonitorProcess, headers: dict[str, str], body: bytes) -> int:
    req = urllib.request.Request(mon.url("/api/rebaseline"), data=body, method="POST",
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _baseline_runs(mon: MonitorProcess, agent: str) -> float:
    return counter(scrape(mon.addresses["metrics"]), "assaywatch_baseline_runs", agent=agent)


def test_rebaseline_needs_token_same_origin_and_own_host(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.delenv("ASSAYWATCH_API_TOKEN", raising=False)
    state = tmp_path / "state"
    mon = MonitorProcess("--config", str(write_config(tmp_path)), "--state-dir", str(state),
                         "--log-level", "WARNING").start()
    try:
        token_file = state / "api-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        by = Bystander(mon)
        by.send(21)  # learn_runs 20: the baseline freezes
        wait_for(mon.addresses["metrics"],
                 lambda s: counter(s, "assaywatch_baseline_runs", agent=by.AGENT) == 20,
                 30, "the bystander's baseline")
        labels = json.dumps({"agent": by.AGENT, "version": "1.0",
                             "scenario": "support"}).encode()
        port = mon.addresses["metrics"].rsplit(":", 1)[1]
        ok = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        refused = [
            ({"Content-Type": "application/json"}, labels, 401),       # no credentials
            # a browser "simple request" form post from a foreign page
            ({"Content-Type": "application/x-www-form-urlencoded",
              "Origin": "http://evil.example"}, b"agent=bystander-agent", 403),
            ({**ok, "Origin": "http://evil.example"}, labels, 403),    # CSRF with a token
            ({**ok, "Host": f"rebind.evil.example:{port}"}, labels, 403),  # DNS rebinding
            ({**ok, "Content-Type": "text/plain"}, labels, 415),
        ]
        for headers, body, want in refused:
            assert _post(mon, headers, body) == want, headers
        assert _baseline_runs(mon, by.AGENT) == 20  # nothing refused changed the stream
        assert not (state / "events.jsonl").exists()
        # the command line reads the token from the state dir and sends it
        res = subprocess.run(
            [sys.executable, "-m", "assaywatch.monitor.commands.cli", "baseline", "reset",
             "--url", f"http://{mon.addresses['metrics']}", "--state-dir", str(state),
             "--agent", by.AGENT, "--version", "1.0", "--scenario", "support"],
            capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert _baseline_runs(mon, by.AGENT) == 0  # learning again
        (event,) = [json.loads(line) for line in (state / "events.jsonl").read_text()
                    .splitlines()]
        assert event["event"] == "rebaseline" and event["agent"] == by.AGENT
        assert event["by"]["remote"] == "127.0.0.1" and len(event["by"]["token_id"]) == 12
        by.close()
    finally:
        code, err = mon.stop()
    assert code == 0 and "Traceback" not in err, err[-3000:]


def test_lone_surrogate_cannot_poison_scrapes_across_restart(tmp_path: Path) -> None:
    state, cfg = tmp_path / "state", write_config(tmp_path)
    mon = MonitorProcess("--config", str(cfg), "--state-dir", str(state),
                         "--log-level", "WARNING").start()
    try:
        by = Bystander(mon)
        by.send(3)
        spans = run_spans("poisonSURR", 7, scenario="sSURR")
        root = next(s for s in spans if s.attributes.get("gen_ai.operation.name")
                    == "invoke_agent")
        root.attributes["gen_ai.agent.version"] = "vSURR"
        body = json_bytes(spans).replace(b"SURR", b"\\ud800")
        assert OtlpHttp(mon.addresses["otlp_http"]).post(body, JSON).status == 200
        wait_for(mon.addresses["metrics"],
                 lambda s: counter(s, "assaywatch_runs_total", agent="poison\ufffd\ufffd\ufffd")
                 == 1, 20, "the repaired stream")
        by.check()
        sent = by.sent
        metrics_ok(mon)
        by.close()
    finally:
        code, err = mon.stop()
    assert code == 0 and "Traceback" not in err, err[-3000:]
    again = MonitorProcess("--config", str(cfg), "--state-dir", str(state),
                           "--log-level", "WARNING").start()
    try:
        samples = metrics_ok(again)
        assert counter(samples, "assaywatch_runs_total", agent=Bystander.AGENT) == sent
        assert counter(samples, "assaywatch_runs_total", agent="poison\ufffd\ufffd\ufffd") == 1
    finally:
        code, err = again.stop()
    assert code == 0 and "Traceback" not in err, err[-3000:]


def test_state_dir_already_poisoned_still_scrapes(tmp_path: Path) -> None:
    """A checkpoint written before the edge repaired strings holds a stream key with a lone
    surrogate: the exposition repairs it instead of answering 500 for every stream."""
    state = tmp_path / "state"
    cfg = MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "", "metrics": "127.0.0.1:0"},
        "state_dir": str(state), "detectors": {"learn_runs": 20}})
    old = Monitor(cfg)
    import numpy as np

    for key in (StreamKey("bad\ud800agent", "1\udfff", "s"), StreamKey("good-agent", "1", "s")):
        with old.pipeline.lock:
            old.engine.process_closed(simulate_runs(5, np.random.default_rng(1), key=key))
    old.checkpoint()
    mon = MonitorProcess("--config", str(write_config(tmp_path)), "--state-dir", str(state),
                         "--log-level", "WARNING").start()
    try:
        samples = metrics_ok(mon)
        assert counter(samples, "assaywatch_runs_total", agent="good-agent") == 5
        assert counter(samples, "assaywatch_runs_total", agent="bad\ufffd\ufffd\ufffdagent") == 5
        assert get(mon.url("/metrics"))[0] == 200
    finally:
        code, err = mon.stop()
    assert code == 0, err[-3000:]
