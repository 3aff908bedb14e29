"""Bad input against a real ``assaywatch monitor`` process, over real loopback HTTP and gRPC.

One monitor subprocess serves the whole module. Throughout, a *healthy* agent stream is fed
in parallel (one 9-span run per request, alternating OTLP/HTTP protobuf and OTLP/gRPC) and
``/healthz`` is polled; each test sends one kind of bad input and checks the prescribed
answer (HTTP status / gRPC status / partial success) and the exact counter increments in
``/metrics`` (``assaywatch_spans_rejected_total{receiver,reason}``,
``assaywatch_spans_dropped_total{reason}``). The last test stops the feeder and checks that
the healthy stream assembled exactly the runs sent, raised no alarm, and that the process
never stopped answering ``/healthz``.

Counter deltas are attributable to one test at a time because the healthy stream's spans
are all valid and close by grace: it never moves a rejected or dropped counter.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from assaywatch.monitor.receivers.spans import SpanRecord
from tests.e2e.otel_agent import MonitorProcess
from tests.e2e.rawotlp import (
    JSON,
    PROTOBUF,
    OtlpGrpc,
    OtlpHttp,
    Samples,
    genai_run_script,
    gzip_bomb,
    gzip_bytes,
    json_bytes,
    live_factory,
    proto_bytes,
    scrape,
    value,
    wait_for,
)
from tests.monitor.spanfactory import MS, SpanFactory

pytestmark = [pytest.mark.e2e]

MAX_AGE = 2.5
LEARN = 60
HEALTHY = "healthy-agent"
HEALTHY_TOOLS = ("lookup_order", "search_kb", "refund")
CONFIG = f"""
assembler:
  grace_seconds: 0.3
  max_age_seconds: {MAX_AGE}
detectors:
  learn_runs: {LEARN}
  hotelling_window: 50
  hotelling_every: 10
"""


# --------------------------------------------------------------------------- harness


class HealthyFeeder(threading.Thread):
    """Sends seeded healthy runs until stopped; counts what the monitor accepted."""

    def __init__(self, addresses: dict[str, str], period_s: float = 0.02) -> None:
        super().__init__(name="healthy-feeder", daemon=True)
        self.http = OtlpHttp(addresses["otlp_http"])
        self.grpc = OtlpGrpc(addresses["otlp_grpc"])
        self.period_s = period_s
        self.factory = live_factory(seed=99, service="healthy-svc")
        self.rng = np.random.default_rng(20260101)
        self.sent = 0
        self.failures: list[str] = []
        self._halt = threading.Event()

    def _one(self) -> bytes:
        n = int(self.rng.integers(1, 4))
        tools = [str(t) for t in self.rng.choice(HEALTHY_TOOLS, size=n)]
        script = genai_run_script(tools, name=HEALTHY, passed=bool(self.rng.random() < 0.9))
        return proto_bytes(self.factory.agent_run(script, "genai"))

    def run(self) -> None:
        while not self._halt.is_set():
            body = self._one()
            for _ in range(50):  # retry only on back-pressure answers
                if self.sent % 2:
                    code, detail, _ = self.grpc.send(body)
                    ok, retry = code is grpc.StatusCode.OK, code is grpc.StatusCode.UNAVAILABLE
                else:
                    reply = self.http.post(body)
                    ok, retry, detail = reply.status == 200, reply.status == 503, ""
                    code = reply.status  # type: ignore[assignment]
                if ok:
                    self.sent += 1
                    break
                if not retry:
                    self.failures.append(f"healthy run refused: {code} {detail}")
                    break
                time.sleep(0.2)
            self._halt.wait(self.period_s)

    def stop(self) -> int:
        self._halt.set()
        self.join(timeout=30)
        self.http.close()
        self.grpc.close()
        return self.sent


class HealthPoller(threading.Thread):
    def __init__(self, metrics: str) -> None:
        super().__init__(name="healthz-poller", daemon=True)
        self.url = f"http://{metrics}/healthz"
        self.polls = 0
        self.failures: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.1):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    if r.status != 200:
                        self.failures.append(f"/healthz answered {r.status}")
            except Exception as exc:  # any failure to answer is what we look for
                self.failures.append(f"/healthz failed: {exc!r}")
            self.polls += 1

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


class Harness:
    def __init__(self, mon: MonitorProcess) -> None:
        self.mon = mon
        self.metrics = mon.addresses["metrics"]
        self.http = OtlpHttp(mon.addresses["otlp_http"])
        self.grpc = OtlpGrpc(mon.addresses["otlp_grpc"])
        self.feeder = HealthyFeeder(mon.addresses)
        self.poller = HealthPoller(self.metrics)

    def scrape(self) -> Samples:
        return scrape(self.metrics)

    def counters(self) -> dict[tuple[str, ...], float]:
        """Every rejected and dropped counter, keyed (family, receiver?, reason)."""
        out: dict[tuple[str, ...], float] = {}
        for name, labels, v in self.scrape():
            if name == "assaywatch_spans_rejected_total":
                out[("rejected", labels["receiver"], labels["reason"])] = v
            elif name == "assaywatch_spans_dropped_total":
                out[("dropped", labels["reason"])] = v
        return out

    def assert_alive(self) -> None:
        assert self.mon.proc is not None and self.mon.proc.poll() is None, "monitor exited"


def deltas(before: dict[tuple[str, ...], float],
           after: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    keys = set(before) | set(after)
    return {k: after.get(k, 0) - before.get(k, 0) for k in keys
            if after.get(k, 0) != before.get(k, 0)}


def runs_of(samples: Samples, agent: str) -> float:
    return value(samples, "assaywatch_runs_total", agent=agent)


def wait_runs(h: Harness, agent: str, n: float, timeout: float = 20.0) -> Samples:
    return wait_for(h.metrics, lambda s: runs_of(s, agent) >= n, timeout,
                    f"{n:g} runs of {agent}")


def wait_counters(h: Harness, before: dict[tuple[str, ...], float],
                  expected: dict[tuple[str, ...], float], timeout: float = 10.0) -> None:
    """Wait until the counter deltas reach ``expected``, then require them to be exact."""
    deadline = time.monotonic() + timeout
    got: dict[tuple[str, ...], float] = {}
    while time.monotonic() < deadline:
        got = deltas(before, h.counters())
        if all(got.get(k, 0) >= v for k, v in expected.items()):
            break
        time.sleep(0.1)
    assert got == expected


@pytest.fixture(scope="module")
def h(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    cfg = Path(tmp_path_factory.mktemp("bad-input")) / "monitor.yaml"
    cfg.write_text(CONFIG)
    mon = MonitorProcess("--config", str(cfg), "--log-level", "WARNING").start()
    harness = Harness(mon)
    harness.feeder.start()
    harness.poller.start()
    try:
        yield harness
    finally:
        try:
            harness.feeder.stop()
            harness.poller.stop()
            harness.http.close()
            harness.grpc.close()
        finally:
            code, err = mon.stop()  # never leak the subprocess
        assert code == 0, err[-3000:]
        # bad input is answered and counted, never a logged crash of a handler
        assert "Traceback" not in err, err[-3000:]


def run_spans(agent: str, seed: int, tools: tuple[str, ...] = ("t1", "t2")) -> list[SpanRecord]:
    return live_factory(seed, service=f"{agent}-svc").agent_run(
        genai_run_script(list(tools), name=agent), "genai")


# --------------------------------------------------------------------------- malformed bodies


def test_truncated_protobuf_gets_400_and_invalid_argument(h: Harness) -> None:
    body = proto_bytes(run_spans("truncated-agent", 1))
    cut = body[: len(body) // 2 + 3]
    before = h.counters()
    reply = h.http.post(cut)
    assert reply.status == 400
    assert reply.headers["content-type"] == PROTOBUF
    code, detail, _ = h.grpc.send(cut)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "ExportTraceServiceRequest" in detail
    wait_counters(h, before, {("rejected", "otlp_http", "malformed_protobuf"): 1,
                              ("rejected", "otlp_grpc", "malformed_protobuf"): 1})
    assert runs_of(h.scrape(), "truncated-agent") == 0
    h.assert_alive()


def test_invalid_json_and_wrong_content_type(h: Harness) -> None:
    good = json_bytes(run_spans("json-agent", 2))
    before = h.counters()
    reply = h.http.post(good[:-7] + b"{,]", JSON)
    assert reply.status == 400 and reply.headers["content-type"] == JSON
    assert b"not valid JSON" in reply.body
    reply = h.http.post(good, "text/plain")
    assert reply.status == 415 and b"unsupported Content-Type" in reply.body
    reply = h.http.post(good, JSON, {"Content-Encoding": "br"})
    assert reply.status == 415
    # the same body, correctly labelled, is accepted: the refusals were about the request
    assert h.http.post(good, JSON).status == 200
    wait_counters(h, before, {("rejected", "otlp_http", "malformed_json"): 1,
                              ("rejected", "otlp_http", "unsupported_content_type"): 1,
                              ("rejected", "otlp_http", "unsupported_encoding"): 1})
    wait_runs(h, "json-agent", 1)
    h.assert_alive()


def test_gzip_bomb_gets_413_without_inflating_it(h: Harness) -> None:
    bomb = gzip_bomb(1 << 30)  # 1 GiB of zeros in ~1 MB, past the 64 MiB inflation cap
    assert len(bomb) < 2 << 20
    before = h.counters()
    t0 = time.monotonic()
    reply = h.http.post(bomb, PROTOBUF, {"Content-Encoding": "gzip"})
    elapsed = time.monotonic() - t0
    assert reply.status == 413 and b"inflates to more than" in reply.body
    # Stopping at the cap inflates 64 MiB, not 1 GiB: well under the ~7 s a full
    # inflation of 1 GiB takes on this class of machine.
    assert elapsed < 5.0
    # gRPC: a gzip-compressed message inflating past the receive cap is refused by grpc
    # itself (RESOURCE_EXHAUSTED) before our handler runs, so no counter can see it.
    code, _, _ = h.grpc.send(bytes(32 << 20), compression=grpc.Compression.Gzip)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    wait_counters(h, before, {("rejected", "otlp_http", "decompressed_too_large"): 1})
    h.assert_alive()


def test_ten_megabyte_attribute(h: Harness) -> None:
    spans = run_spans("big-attr-agent", 3)
    spans[0].attributes["gen_ai.tool.call.result"] = "x" * (10 << 20)
    raw = proto_bytes(spans)
    before = h.counters()
    reply = h.http.post(raw)  # 10 MB body past the 8 MiB request cap
    assert reply.status == 413 and b"8388608-byte limit" in reply.body
    code, _, _ = h.grpc.send(raw)
    # above the 8 MiB cap and below grpc's own 16 MiB receive limit: refused and counted
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    # gzipped it fits the wire cap; the value is truncated to 64 KiB and the run kept
    reply = h.http.post(gzip_bytes(raw), PROTOBUF, {"Content-Encoding": "gzip"})
    assert reply.status == 200
    resp = ExportTraceServiceResponse()
    resp.ParseFromString(reply.body)
    assert not resp.HasField("partial_success")
    wait_counters(h, before, {("rejected", "otlp_http", "body_too_large"): 1,
                              ("rejected", "otlp_grpc", "message_too_large"): 1,
                              ("dropped", "attribute_value_truncated"): 1})
    wait_runs(h, "big-attr-agent", 1)
    h.assert_alive()


def test_missing_ids_get_partial_success_and_keep_the_rest(h: Harness) -> None:
    f = live_factory(4, service="ids-svc")
    for transport in ("http", "grpc"):
        spans = f.agent_run(genai_run_script(["a", "b"], name="ids-agent"), "genai")
        bad = f.agent_run(genai_run_script(["c"], name="ids-agent"), "genai")
        bad[0].trace_id = ""
        bad[1].trace_id = ""
        bad[2].span_id = ""
        before = h.counters()
        body = proto_bytes(spans + bad)
        if transport == "http":
            reply = h.http.post(body)
            assert reply.status == 200
            resp = ExportTraceServiceResponse()
            resp.ParseFromString(reply.body)
        else:
            code, _, parsed = h.grpc.send(body)
            assert code is grpc.StatusCode.OK and parsed is not None
            resp = parsed
        assert resp.partial_success.rejected_spans == 3
        assert "missing_trace_id=2" in resp.partial_success.error_message
        receiver = f"otlp_{transport}"
        wait_counters(h, before, {("rejected", receiver, "missing_trace_id"): 2,
                                  ("rejected", receiver, "missing_span_id"): 1})
    # each request's intact run is assembled; the mutilated ones left no fragments
    wait_runs(h, "ids-agent", 2)
    time.sleep(0.5)
    assert runs_of(h.scrape(), "ids-agent") == 2
    h.assert_alive()


# --------------------------------------------------------------------------- hostile traces


def deep_chain(depth: int, agent: str, seed: int) -> list[SpanRecord]:
    """One trace: an agent root and a chain of ``depth - 1`` spans, each the child of the
    previous (cycling agent, tool and chat spans), all within the root's time window."""
    f = SpanFactory(seed=seed, service_name=f"{agent}-svc", capture_content=False)
    tid, t0 = f.trace_id(), time.time_ns()
    ids = [f.span_id() for _ in range(depth)]
    out: list[SpanRecord] = []
    kinds = [({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "inner"}, 1),
             ({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "step"}, 1),
             ({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
               "gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 1}, 3)]
    res = {"service.name": f"{agent}-svc"}
    for i in range(depth):
        if i == 0:
            attrs, kind = {"gen_ai.operation.name": "invoke_agent",
                           "gen_ai.agent.name": agent}, 1
        else:
            attrs, kind = kinds[i % 3]
        out.append(SpanRecord(tid, ids[i], ids[i - 1] if i else "", f"span {i}",
                              t0 + i * 1000, t0 + 10 * MS * depth - i * 1000, kind=kind,
                              attributes=dict(attrs), resource=res))
    return out[::-1]  # children end first


def test_thousand_nested_spans_make_one_run(h: Harness) -> None:
    before = h.counters()
    spans = deep_chain(1000, "deep-agent", 5)
    assert h.http.post(proto_bytes(spans)).status == 200
    code, _, _ = h.grpc.send(proto_bytes(deep_chain(1000, "deep-agent", 6)))
    assert code is grpc.StatusCode.OK
    wait_runs(h, "deep-agent", 2)
    time.sleep(0.5)
    assert runs_of(h.scrape(), "deep-agent") == 2
    assert deltas(before, h.counters()) == {}  # nothing dropped: no cycle, no recursion
    h.assert_alive()


def test_trace_whose_root_never_arrives_closes_at_max_age(h: Harness) -> None:
    """Children of an agent span that is never exported (the process died mid-run): the
    trace is not ready (tool and LLM spans wait for their agent), so it stays pending until
    ``max_age_seconds`` and is then dropped as ``no_root_span``: a run rooted at a
    fragment would carry a wrong stream key."""
    f = live_factory(7, service="orphan-svc")
    spans = f.agent_run(genai_run_script(["x", "y"], name="orphan-agent"), "genai")
    children = spans[:-1]  # the agent span (last, it ends last) never arrives
    assert all(s.parent_span_id == spans[-1].span_id for s in children)
    before = h.counters()
    t0 = time.monotonic()
    assert h.http.post(proto_bytes(children)).status == 200
    time.sleep(MAX_AGE / 2)
    assert deltas(before, h.counters()) == {}, "closed before max_age"
    wait_counters(h, before, {("dropped", "no_root_span"): len(children)},
                  timeout=MAX_AGE + 5)
    assert time.monotonic() - t0 >= MAX_AGE
    assert runs_of(h.scrape(), "orphan-agent") == 0
    h.assert_alive()


def test_clock_skew_does_not_break_assembly(h: Harness) -> None:
    """(a) children starting before and ending after their parent, one with end < start;
    (b) a remote tool service whose clock runs three hours ahead; (c) a whole trace from a
    host whose clock is a day behind. Assembly uses the monitor's monotonic arrival clock
    and span ids, never span timestamps, so every run is assembled and nothing dropped."""
    f = live_factory(8, service="skew-svc")
    hours = 3 * 3600 * 10**9
    a = f.agent_run(genai_run_script(["p", "q"], name="skew-agent"), "genai")
    root = a[-1]
    a[0].start_ns = root.start_ns - 5 * 10**9
    a[1].end_ns = root.end_ns + 5 * 10**9
    a[2].end_ns = a[2].start_ns - 10**6  # negative duration: latency clamps to 0
    b = f.agent_run(genai_run_script(["r"], name="skew-agent"), "genai")
    for s in b[:-1]:
        s.resource = {"service.name": "remote-tool-svc"}
        s.start_ns += hours
        s.end_ns += hours
    c = live_factory(9, service="skew-svc").agent_run(
        genai_run_script(["s"], name="skew-agent"), "genai")
    for s in c:
        s.start_ns -= 8 * hours
        s.end_ns -= 8 * hours
    before = h.counters()
    assert h.http.post(proto_bytes(a)).status == 200
    code, _, _ = h.grpc.send(proto_bytes(b))
    assert code is grpc.StatusCode.OK
    assert h.http.post(json_bytes(c), JSON).status == 200
    wait_runs(h, "skew-agent", 3)
    assert deltas(before, h.counters()) == {}
    h.assert_alive()


# --------------------------------------------------------------------------- throughout


def test_healthy_stream_unharmed_throughout(h: Harness) -> None:
    # Keep the feeder running long enough that the baseline freezes and the detectors run.
    deadline = time.monotonic() + 30
    while h.feeder.sent < LEARN + 150 and time.monotonic() < deadline:
        time.sleep(0.1)
    sent = h.feeder.stop()
    h.poller.stop()
    assert not h.feeder.failures, h.feeder.failures[:5]
    assert sent >= LEARN + 150
    samples = wait_runs(h, HEALTHY, sent)
    time.sleep(1.0)  # nothing more may arrive: exactly the runs sent, no duplicates
    samples = h.scrape()
    assert runs_of(samples, HEALTHY) == sent
    assert value(samples, "assaywatch_baseline_runs", agent=HEALTHY) == LEARN
    assert value(samples, "assaywatch_alarms_total", agent=HEALTHY) == 0
    assert value(samples, "assaywatch_alarm", agent=HEALTHY) == 0
    assert h.poller.polls > 20 and not h.poller.failures, h.poller.failures[:5]
    h.assert_alive()
