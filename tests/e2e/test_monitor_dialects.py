"""Dialects end to end: one logical agent, five tracing dialects, one set of runs.

The same seeded sequence of agent runs is emitted as OpenTelemetry GenAI (current and
pre-1.37 names), OpenInference, OpenLLMetry/Traceloop and Langfuse spans
(``tests.monitor.spanfactory``), each dialect under its own agent name so the monitor keeps
a stream per dialect. Requests rotate over OTLP/HTTP protobuf, OTLP/HTTP JSON, gzipped
protobuf and OTLP/gRPC, to a real ``assaywatch monitor`` process. Half the traces are HTTP
request traces holding two agent invocations, which must count as two runs each.

What is compared, per stream: run counts and outcomes (``/metrics``, ``/api/streams``),
and the baseline each stream froze from exactly those runs, read back from the monitor's
own checkpoint (``StateStore`` in the state dir): tool counts, decision-path counts,
models, pass/fail counts and the fingerprint mean and covariance. Every stream must equal
every other and equal the baseline built offline from the same spans.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from assaywatch.analyzers.baseline import Baseline, build_baseline
from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.engine.streams import StreamState
from assaywatch.monitor.pipeline.assemble import assemble_all
from assaywatch.monitor.receivers.spans import SpanRecord
from assaywatch.monitor.service.state import StateStore
from tests.e2e.otel_agent import MonitorProcess
from tests.e2e.rawotlp import (
    JSON,
    PROTOBUF,
    OtlpGrpc,
    OtlpHttp,
    gzip_bytes,
    json_bytes,
    proto_bytes,
    scrape,
    value,
    wait_for,
)
from tests.monitor.spanfactory import DIALECTS, Agent, EvalSpec, SpanFactory, tool_agent

pytestmark = [pytest.mark.e2e]

N_TRACES = 24  # half single runs, half HTTP traces with two agent invocations
RUNS = N_TRACES // 2 + 2 * (N_TRACES // 2)
TOOLS = ("search_flights", "book_hotel", "cancel_booking")
T0 = 1_760_000_000 * 10**9


def scripts(seed: int, name: str) -> list[Agent]:
    """The seeded logical runs: 1-3 tools from TOOLS, an evaluation passing w.p. 0.75."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(N_TRACES):
        tools = tuple(str(t) for t in rng.choice(TOOLS, size=int(rng.integers(1, 4))))
        a = tool_agent(tools, name=name, scenario="booking")
        a.evaluation = EvalSpec(passed=bool(rng.random() < 0.75))
        out.append(a)
    return out


def traces(dialect: str, index: int) -> list[list[SpanRecord]]:
    """One dialect's traces. The factory seed differs per dialect (distinct trace and span
    ids, so streams never share a trace) while timestamps start at the same T0, so the
    runs are identical up to ids."""
    f = SpanFactory(seed=1000 + index, service_name="travel-svc", start_ns=T0,
                    capture_content=True)
    out = []
    for i, a in enumerate(scripts(7, f"trip-{dialect}")):
        out.append(f.agent_run(a, dialect) if i % 2 == 0 else f.http_request([a, a], dialect))
    return out


def comparable(b: Baseline) -> dict[str, object]:
    return {"n_runs": b.n_runs, "passes": b.passes, "fails": b.fails,
            "unknown": b.unknown, "tools": b.tools, "tool_counts": b.tool_counts,
            "path_counts": b.path_counts, "models": b.models,
            "feature_names": b.feature_names, "states": b.states}


def test_dialects_over_otlp_assemble_into_the_same_runs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = tmp_path / "monitor.yaml"
    cfg.write_text(f"assembler:\n  grace_seconds: 0.3\ndetectors:\n  learn_runs: {RUNS}\n"
                   "checkpoint_seconds: 60\n")
    mon = MonitorProcess("--config", str(cfg), "--state-dir", str(state),
                         "--log-level", "WARNING").start()
    sent: dict[str, list[SpanRecord]] = {}
    try:
        http = OtlpHttp(mon.addresses["otlp_http"])
        rpc = OtlpGrpc(mon.addresses["otlp_grpc"])
        for d_index, dialect in enumerate(DIALECTS):
            sent[dialect] = []
            for i, spans in enumerate(traces(dialect, d_index)):
                sent[dialect].extend(spans)
                how = (i + d_index) % 4
                if how == 0:
                    assert http.post(proto_bytes(spans)).status == 200
                elif how == 1:
                    assert http.post(json_bytes(spans), JSON).status == 200
                elif how == 2:
                    reply = http.post(gzip_bytes(proto_bytes(spans)), PROTOBUF,
                                      {"Content-Encoding": "gzip"})
                    assert reply.status == 200
                else:
                    code, detail, _ = rpc.send(proto_bytes(spans))
                    assert code is grpc.StatusCode.OK, detail
        http.close()
        rpc.close()
        agents = [f"trip-{d}" for d in DIALECTS]
        samples = wait_for(
            mon.addresses["metrics"],
            lambda s: all(value(s, "assaywatch_runs_total", agent=a) >= RUNS for a in agents),
            timeout=30, what=f"{RUNS} runs in each dialect's stream")
        samples = scrape(mon.addresses["metrics"])
        outcomes = {a: tuple(value(samples, "assaywatch_runs_total", agent=a, outcome=o)
                             for o in ("pass", "fail", "unknown")) for a in agents}
        # two agent invocations per HTTP trace counted as two runs; nothing else dropped
        assert all(sum(v) == RUNS for v in outcomes.values()), outcomes
        assert len(set(outcomes.values())) == 1, outcomes
        assert value(samples, "assaywatch_spans_dropped_total") == 0
        assert value(samples, "assaywatch_spans_rejected_total") == 0
        with urllib.request.urlopen(mon.url("/api/streams"), timeout=10) as r:
            streams = {s["agent"]: s for s in json.load(r)["streams"]}
        assert set(streams) == set(agents)
        summaries = {(s["scenario"], s["version"], s["runs"], json.dumps(s["outcomes"],
                      sort_keys=True), s["learning"], s["baseline"]["runs"],
                      s["baseline"]["pass_rate"]) for s in streams.values()}
        assert len(summaries) == 1, summaries
        assert not streams[agents[0]]["learning"]
    finally:
        code, err = mon.stop()
    assert code == 0, err[-3000:]

    # The monitor's own checkpoint, written at shutdown: each stream's frozen baseline.
    saved = StateStore(state).load()
    engine_streams: dict[StreamKey, StreamState] = saved["engine"][0]
    baselines = {k.agent: st.baseline for k, st in engine_streams.items()}
    assert set(baselines) == {f"trip-{d}" for d in DIALECTS}
    reference = build_baseline(assemble_all(sent["genai"]))
    assert reference.n_runs == RUNS and reference.tool_counts  # a non-trivial reference
    for agent, b in baselines.items():
        assert b is not None, f"{agent} has no frozen baseline"
        assert comparable(b) == comparable(reference), agent
        np.testing.assert_allclose(b.mean, reference.mean, rtol=1e-9, atol=1e-12,
                                   err_msg=agent)
        np.testing.assert_allclose(b.cov, reference.cov, rtol=1e-7, atol=1e-10,
                                   err_msg=agent)
