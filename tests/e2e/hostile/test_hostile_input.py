"""Hostile OTLP input against a real ``assaywatch monitor`` process, over both receivers.

Each case asserts the answer (HTTP status / gRPC code), the counter that records it, that
another stream's runs (:class:`Bystander`) are assembled exactly and without alarm after it,
and, at the end, that the monitor's peak RSS (VmHWM) stayed under
:data:`~tests.e2e.hostile.harness.PEAK_RSS_BOUND_MIB`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.e2e.hostile.harness import (
    PEAK_RSS_BOUND_MIB,
    Bystander,
    counter,
    metrics_ok,
    peak_rss_mib,
    run_spans,
    write_config,
)
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
    wait_for,
)

pytestmark = [pytest.mark.e2e]

REJECTED = "assaywatch_spans_rejected_total"
SANITISED = "assaywatch_values_sanitised_total"


class Env:
    def __init__(self, mon: MonitorProcess) -> None:
        self.mon = mon
        self.http = OtlpHttp(mon.addresses["otlp_http"])
        self.grpc = OtlpGrpc(mon.addresses["otlp_grpc"])
        self.bystander = Bystander(mon)

    def counters(self) -> dict[tuple[str, str, str], float]:
        out = {}
        for name, labels, v in scrape(self.mon.addresses["metrics"]):
            if name in (REJECTED, SANITISED):
                out[(name, labels["receiver"], labels["reason"])] = v
        return out

    def delta(self, before: dict[tuple[str, str, str], float], name: str, receiver: str,
              reason: str) -> float:
        key = (name, receiver, reason)
        return self.counters().get(key, 0) - before.get(key, 0)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    cfg = write_config(Path(tmp_path_factory.mktemp("hostile")))
    mon = MonitorProcess("--config", str(cfg), "--log-level", "WARNING").start()
    e = Env(mon)
    try:
        e.bystander.send(3)
        e.bystander.check()
        yield e
    finally:
        e.http.close()
        e.grpc.close()
        e.bystander.close()
        code, err = mon.stop()
    assert code == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]


def _root(spans: list) -> object:
    return next(s for s in spans if s.attributes.get("gen_ai.operation.name") == "invoke_agent")


# --------------------------------------------------------------------------- strings


def test_lone_surrogates_are_replaced_and_scrapes_stay_200(env: Env) -> None:
    spans = run_spans("evilSURRagent", 1, scenario="scenSURR")
    _root(spans).attributes["gen_ai.agent.version"] = "1.SURR"  # type: ignore[attr-defined]
    # protobuf cannot carry a lone surrogate; OTLP/JSON can: the escape "\\ud800"
    body = json_bytes(spans).replace(b"SURR", b"\\ud800")
    before = env.counters()
    assert env.http.post(body, JSON).status == 200
    # the same, as raw UTF-8-encoded surrogate bytes (json.loads lets those through too)
    raw = json_bytes(run_spans("rawSURRagent", 2)).replace(b"SURR", b"\xed\xa0\x80")
    assert env.http.post(raw, JSON).status == 200
    samples = wait_for(env.mon.addresses["metrics"],
                       lambda s: counter(s, "assaywatch_runs_total",
                                         agent="evil\ufffd\ufffd\ufffdagent") >= 1
                       and counter(s, "assaywatch_runs_total",
                                   agent="raw\ufffd\ufffd\ufffdagent") >= 1,
                       20, "the repaired streams")
    assert samples
    assert env.delta(before, SANITISED, "otlp_http", "invalid_utf8") >= 4
    metrics_ok(env.mon)
    env.bystander.check()


def test_long_names_and_label_values_are_cut(env: Env) -> None:
    for transport in ("http", "grpc"):
        spans = run_spans("x" * 5000 + transport, 3 if transport == "http" else 33)
        for s in spans:
            s.scope_name = "scope-" + "n" * 10_000
        _root(spans).attributes["k" * 1000] = "v"  # type: ignore[attr-defined]
        before = env.counters()
        receiver = f"otlp_{transport}"
        if transport == "http":
            assert env.http.post(proto_bytes(spans)).status == 200
        else:
            assert env.grpc.send(proto_bytes(spans))[0] is grpc.StatusCode.OK
        assert env.delta(before, SANITISED, receiver, "label_value_truncated") >= 2
        assert env.delta(before, SANITISED, receiver, "name_truncated") >= 2
    samples = wait_for(env.mon.addresses["metrics"],
                       lambda s: counter(s, "assaywatch_runs_total", agent="x" * 256) >= 2,
                       20, "two runs of the cut agent name")
    assert all(len(v) <= 256 for _, labels, _ in samples for v in labels.values())
    env.bystander.check()


def test_span_times_are_checked(env: Env) -> None:
    spans = run_spans("clock-agent", 4)
    spans[0].end_ns = spans[0].start_ns - 10**9  # ends before it starts: clamped
    spans[1].start_ns, spans[1].end_ns = 1, 2  # 1970: kept, counted
    spans[2].end_ns = 16_725_225_600 * 10**9  # year 2500: kept, counted
    before = env.counters()
    reply = env.http.post(proto_bytes(spans))
    assert reply.status == 200
    resp = ExportTraceServiceResponse.FromString(reply.body)
    assert not resp.HasField("partial_success")
    assert env.delta(before, SANITISED, "otlp_http", "end_before_start") == 1
    assert env.delta(before, SANITISED, "otlp_http", "time_out_of_range") == 2
    # times no fixed64 can hold (JSON only) reject their span
    doc = json.loads(json_bytes(run_spans("clock-agent", 5)))
    sps = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    sps[0]["startTimeUnixNano"] = str(2**64)
    sps[1]["endTimeUnixNano"] = "-5"
    sps[2]["startTimeUnixNano"] = "1e999"
    before = env.counters()
    reply = env.http.post(json.dumps(doc).encode(), JSON)
    assert reply.status == 200 and json.loads(reply.body)["partialSuccess"]["rejectedSpans"] == "3"
    assert env.delta(before, REJECTED, "otlp_http", "invalid_timestamp") == 3
    env.bystander.check()


# --------------------------------------------------------------------------- memory


def _json_object_bomb(inflated: int = 60 << 20) -> bytes:
    n = inflated // 3
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [c.compress(b'{"resourceSpans":[')]
    chunk = b"{}," * (1 << 20)
    for _ in range(n // (1 << 20)):
        out.append(c.compress(chunk))
    out.append(c.compress(b"{}]}"))
    out.append(c.flush())
    return b"".join(out)


def test_json_object_bomb_is_refused_before_it_is_built(env: Env) -> None:
    bomb = _json_object_bomb()
    assert len(bomb) < 200_000  # ~60 KB of gzip, 60 MiB of "{}," inflated
    before = env.counters()
    t0 = time.monotonic()
    reply = env.http.post(bomb, JSON, {"Content-Encoding": "gzip"})
    assert reply.status == 413 and b"JSON values" in reply.body
    assert time.monotonic() - t0 < 10
    assert env.delta(before, REJECTED, "otlp_http", "too_many_values") == 1
    env.bystander.check()


def _ld(tag: int, payload: bytes) -> bytes:
    n, head = len(payload), bytearray([tag])
    while True:
        b, n = n & 0x7F, n >> 7
        head.append(b | (0x80 if n else 0))
        if not n:
            return bytes(head) + payload


def _empty_spans(n: int) -> bytes:
    return _ld(0x0A, _ld(0x12, b"\x12\x00" * n))


def _empty_attributes(n: int) -> bytes:
    span = ExportTraceServiceRequest()
    sp = span.resource_spans.add().scope_spans.add().spans.add(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="bomb")
    inner = sp.SerializeToString() + b"\x4a\x00" * n
    return _ld(0x0A, _ld(0x12, _ld(0x12, inner)))


def _million_spans(n: int) -> bytes:
    one = ExportTraceServiceRequest()
    sp = one.resource_spans.add().scope_spans.add().spans.add(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    span = _ld(0x12, sp.SerializeToString())
    return _ld(0x0A, _ld(0x12, span * n))


def test_protobuf_message_floods_are_refused_before_upb_builds_them(env: Env) -> None:
    cases = [(_empty_spans(3_500_000), "too_many_spans"),        # 7 MiB: ~720 MB in upb
             (_empty_attributes(3_500_000), "too_many_elements")]
    for body, reason in cases:
        before = env.counters()
        reply = env.http.post(gzip_bytes(body), PROTOBUF, {"Content-Encoding": "gzip"})
        assert reply.status == 413, reply.body[:200]
        code, detail, _ = env.grpc.send(body)
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, detail
        assert env.delta(before, REJECTED, "otlp_http", reason) == 1
        assert env.delta(before, REJECTED, "otlp_grpc", reason) == 1
    env.bystander.check()


def test_request_larger_than_the_queue_gets_413_not_503(env: Env) -> None:
    before = env.counters()
    # 1M spans over HTTP (gzip): more than a request may ever carry -> 413, not retried
    reply = env.http.post(gzip_bytes(_million_spans(1_000_000)), PROTOBUF,
                          {"Content-Encoding": "gzip"})
    assert reply.status == 413 and "retry-after" not in reply.headers
    code, _, _ = env.grpc.send(_million_spans(200_000))  # 6 MB, under the byte cap
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert env.delta(before, REJECTED, "otlp_http", "too_many_spans") == 1
    assert env.delta(before, REJECTED, "otlp_grpc", "too_many_spans") == 1
    # gRPC size refusals are counted (up to twice the 8 MiB cap; beyond, grpc refuses alone)
    before = env.counters()
    code, _, _ = env.grpc.send(bytes(12 << 20))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert env.delta(before, REJECTED, "otlp_grpc", "message_too_large") == 1
    env.bystander.check()


def test_413_is_readable_by_a_client_that_sends_everything_first(env: Env) -> None:
    host, port = env.mon.addresses["otlp_http"].rsplit(":", 1)
    body = bytes(10 << 20)
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/x-protobuf\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:100]
    env.bystander.check()


def test_concurrent_gzip_bombs_are_bounded(env: Env) -> None:
    bomb = _json_object_bomb(40 << 20)
    statuses: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        client = OtlpHttp(env.mon.addresses["otlp_http"], timeout=60)
        try:
            status = client.post(bomb, JSON, {"Content-Encoding": "gzip"}).status
        except OSError as exc:  # pragma: no cover - reported below
            status = -1
            print(exc)
        finally:
            client.close()
        with lock:
            statuses.append(status)

    before = env.counters()
    threads = [threading.Thread(target=one) for _ in range(32)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(statuses) == 32 and set(statuses) <= {413, 503}, statuses
    assert statuses.count(413) >= 2  # decoded two at a time, the rest told to retry
    assert time.monotonic() - t0 < 60
    assert env.delta(before, REJECTED, "otlp_http", "too_many_values") == statuses.count(413)
    assert env.delta(before, REJECTED, "otlp_http", "decoder_busy") == statuses.count(503)
    env.bystander.check()


def test_concurrent_grpc_calls_beyond_the_cap_are_told_to_retry(env: Env) -> None:
    """150 gRPC calls at once, each ~70 KiB (a run whose prompt is 64 KiB of text): the
    receiver serves 16 in progress or waiting and answers the others UNAVAILABLE with the
    retry hint, undecoded, each counted as decoder_busy; none gets grpc's RESOURCE_EXHAUSTED
    (which OTLP clients do not retry). Memory: the last test's peak RSS."""
    spans = run_spans("grpcflood", 7, scenario="flood")
    spans[0].attributes["gen_ai.input.messages"] = "x" * (64 << 10)
    body = proto_bytes(spans)
    n = 150
    codes: list[grpc.StatusCode] = []
    hints: list[bool] = []
    lock = threading.Lock()
    start = threading.Barrier(n)

    def one() -> None:
        with grpc.insecure_channel(env.mon.addresses["otlp_grpc"], options=[
                ("grpc.max_send_message_length", 8 << 20)]) as ch:
            call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/"
                                  "Export")
            grpc.channel_ready_future(ch).result(timeout=20)
            start.wait()
            try:
                call(body, timeout=60)
                code, hint = grpc.StatusCode.OK, False
            except grpc.RpcError as err:
                code = err.code()
                hint = "google.rpc.retryinfo-bin" in dict(err.trailing_metadata() or ())
        with lock:
            codes.append(code)
            hints.append(hint)

    before = env.counters()
    received = counter(scrape(env.mon.addresses["metrics"]), "assaywatch_spans_received_total",
                       receiver="otlp_grpc")
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(codes) == n
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, set(codes)
    busy = codes.count(grpc.StatusCode.UNAVAILABLE)
    assert busy >= 1  # the cap acted
    assert all(h for c, h in zip(codes, hints, strict=True)
               if c is grpc.StatusCode.UNAVAILABLE)
    # the pipeline's queue (64 MiB) never fills with these: every refusal is the cap's
    assert env.delta(before, REJECTED, "otlp_grpc", "decoder_busy") == busy
    now = counter(scrape(env.mon.addresses["metrics"]), "assaywatch_spans_received_total",
                  receiver="otlp_grpc")
    assert now - received == codes.count(grpc.StatusCode.OK) * len(spans)
    print(f"{n} calls at once: {n - busy} served, {busy} told to retry")
    env.bystander.check()


def test_slow_drip_clients_do_not_hold_the_receiver(env: Env) -> None:
    host, port = env.mon.addresses["otlp_http"].rsplit(":", 1)
    socks = []
    for _ in range(20):
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/x-protobuf\r\nContent-Length: 100000\r\n\r\nab")
        socks.append(s)
    try:
        env.bystander.check()  # served beside 20 stalled uploads
    finally:
        for s in socks:
            s.close()
    # the metrics port validates Content-Length instead of reading to EOF
    mhost, mport = env.mon.addresses["metrics"].rsplit(":", 1)
    with socket.create_connection((mhost, int(mport)), timeout=10) as s:
        s.sendall(b"POST /api/rebaseline HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Type: application/json\r\nContent-Length: -1\r\n\r\n")
        t0 = time.monotonic()
        assert s.recv(4096).startswith(b"HTTP/1.1 4")
        assert time.monotonic() - t0 < 5


def test_peak_rss_stays_bounded(env: Env) -> None:
    """Last: the monitor's high-water RSS over every case above."""
    peak = peak_rss_mib(env.mon)
    print(f"monitor peak RSS {peak:.0f} MiB (bound {PEAK_RSS_BOUND_MIB})")
    assert peak < PEAK_RSS_BOUND_MIB
    metrics_ok(env.mon)
