"""Overload: a real monitor at ten times its capacity, through the admission proxy.

A load generator written in Go (``tests/e2e/loadgen``, built by the test, standard
library only) posts pre-encoded OTLP/HTTP requests back to back from keep-alive
connections without honouring any retry hint (a flood, not an exporter): realistic
9-span runs whose spans carry ~8 KB of attribute content (prompt and output messages),
and orphan spans of one service (traces whose parents never arrive, so they stay pending
until ``max_age_seconds``). Python sender processes flood the gRPC receiver the same way.
Meanwhile a well-behaved agent sends one run a second and retries what is refused, and
Prometheus is imitated by a scrape every 0.5 s. The queue between receivers and
pipeline is bounded in bytes (``ingest.queue_max_bytes``, the default 64 MiB; its span
bound is far away).

The senders go through the shipped admission proxy (``deploy/admission/haproxy.cfg``
in a real HAProxy, 60 s, 128 flood connections from their own source address 127.0.0.2).
The same scenario straight at the monitor's receivers (30 s, 32 connections) is a
measurement, not a test: ``python -m tests.benchmarks overload`` (one Python process
answers about its own capacity, so the ratio it reaches says how the monitor paces a
flood, x0.5-1.3 measured; in one CI run it refused nothing at all). Checked here:

* capacity: first a short saturating burst of the same requests straight at the monitor
  measures what it accepts (200 answers per second); during the flood the generator's
  answered requests per second (whatever the answer: a refused request is offered load
  too) must be at least :data:`TARGET_RATIO` times that (or than what it accepts during
  the flood, when more), the proxy counting refusals of its own;
* peak RSS (VmHWM) stays within :data:`RSS_BOUND_MIB` (the stated budget, see below);
* every refusal is retryable: 503 with ``Retry-After`` over HTTP, ``UNAVAILABLE`` with a
  ``RetryInfo`` over gRPC; nothing else but successes, and no connection errors;
* ``/metrics`` answers with p99 < 1 s, and no counter goes backwards between scrapes;
* every run of the well-behaved agent is counted while the flood lasts;
* recovery: after the load stops, a fresh run is accepted at once and counted within
  seconds, and the pending traces drain.

The test skips only when the ``go`` or the ``haproxy`` command is missing
(CI has both). It builds with the default build cache and the flags of
``deploy/collector/build.sh`` (``CGO_ENABLED=0``, ``-trimpath``), so on CI the standard
library is already compiled; a cold cache adds ~15 s of CPU. The numbers measured are
printed (``pytest -s``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from assaywatch.monitor.receivers.spans import SpanRecord
from tests.e2e.otel_agent import MonitorProcess
from tests.e2e.rawotlp import (
    EXPORT_METHOD,
    OtlpHttp,
    genai_run_script,
    live_factory,
    proto_bytes,
    scrape,
    value,
)
from tests.infra.haproxy import AdmissionProxy, haproxy_binary

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Seconds of flood: 60 through the admission proxy (the issue's figure); 30 straight at
#: the monitor, whose ratio is recorded, not claimed (CI time)
LOAD_SECONDS = {"admission": 60.0, "monitor": 30.0}
#: The capacity burst: the same requests from a few connections, long enough for the
#: queue to fill and the pipeline to run at its pace.
BURST_SECONDS = 8.0
BURST_CONNS = 8
#: The flood's HTTP connections (the receiver serves 64 at once; more connections do
#: not make the monitor answer faster, they only queue for its decode slots).
FLOOD_CONNS = 32
#: Through the admission proxy, which answers a refused request at once: more connections,
#: from a source address of their own (the flood is one sender; the well-behaved agent and
#: the fresh run come from 127.0.0.1)
ADMISSION_FLOOD_CONNS = 128
FLOOD_SOURCE = "127.0.0.2"
#: The flood's socket send buffer through the admission proxy (bytes; straight at the
#: monitor the kernel's default, as the burst): the generator still writes every body whole,
#: but a request refused before its body is read costs it (and the kernel) the copy of at
#: most this much beyond what the peer's receive window took, instead of the ~450 KB body.
#: The generator shares two cores with HAProxy and the monitor, and a refused request is
#: mostly kernel time (connect, copy, reset): with the default buffer a CI run offered
#: x9.5 where this machine offered x13.6; 32 KiB (and one reused reader per connection)
#: cut the generator's CPU per refused request from ~190 to ~110 us in a run against
#: HAProxy alone. Straight at the monitor, whose Python receiver reads the bodies, it
#: halved the requests accepted (114 against 227 a second, one run each).
FLOOD_SNDBUF = 32 * 1024
#: Offered load during the flood, in multiples of the capacity measured.
TARGET_RATIO = 10.0
#: gRPC calls in flight per Python sender process (2 processes: 8 calls, below the
#: receiver's 16 calls in progress or waiting, above which it answers UNAVAILABLE with the
#: retry hint, counted as decoder_busy).
GRPC_THREADS = 4
SCRAPE_EVERY = 0.5
GOOD_AGENT = "good-agent"
LOADGEN_SRC = Path(__file__).resolve().parent / "loadgen"
#: Estimated bytes queued for the pipeline at most (``ingest.queue_max_bytes``, the
#: default), with a span bound (the default 200,000) that never binds here.
QUEUE_BYTES = 64 * 1024 * 1024
#: Stated peak-RSS bound: the idle process (~150 MiB), the queue (64 MiB of estimated
#: memory, the estimate being within 1.0-1.1 times the real), the assembler's byte
#: budget (128 MiB, the default ``assembler.max_pending_bytes``), requests in flight at
#: the receivers (2 HTTP decodes, 32 MiB of HTTP bodies being received, up to 16 gRPC
#: calls of ~0.5 MB bodies and their decoded spans: ~60 MiB), and a margin of ~100 MiB
#: for the allocator's fragmentation under many threads.
RSS_BOUND_MIB = 512
#: The only answers a flood may get: successes and retryable refusals.
ALLOWED_ANSWERS = frozenset({"http_200", "http_503", "grpc_OK", "grpc_UNAVAILABLE"})

CONFIG = f"""
ingest:
  queue_max_bytes: {QUEUE_BYTES}
assembler:
  grace_seconds: 1.0
  max_age_seconds: 20
detectors:
  learn_runs: 1000000
"""

_WORDS = ("the refund policy applies to orders placed within thirty days of delivery "
          "customer asked about shipping status and a replacement item ").split()


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def _with_content(spans: list[SpanRecord], rng: random.Random) -> list[SpanRecord]:
    """~8 KB of attribute content per span: the prompt (6 KB, never read by the monitor,
    skipped at decode) and the output (2 KB: kept until the span is classified)."""
    for s in spans:
        s.attributes["gen_ai.input.messages"] = _text(rng, 6000)
        s.attributes["gen_ai.output.messages"] = _text(rng, 2000)
    return spans


def _bulk_request(seed: int, runs: int) -> tuple[bytes, list[bytes]]:
    rng = random.Random(seed)
    spans: list[SpanRecord] = []
    tids: list[bytes] = []
    for i in range(runs):
        run = live_factory(seed * 100 + i, service=f"bulk-svc-{seed % 3}").agent_run(
            genai_run_script(["lookup", "refund", "search", "book"], name=f"bulk-{seed % 3}"),
            "genai")
        tids.append(bytes.fromhex(run[0].trace_id))
        spans.extend(_with_content(run, rng))
    return proto_bytes(spans), tids


def _flood_request(seed: int, traces: int, per_trace: int) -> tuple[bytes, list[bytes]]:
    """Orphan LLM spans: every parent is missing, so no trace is ever ready."""
    rng = random.Random(f"flood-{seed}")
    spans: list[SpanRecord] = []
    tids: list[bytes] = []
    now = time.time_ns()
    for _ in range(traces):
        tid = rng.randbytes(16)
        tids.append(tid)
        for _ in range(per_trace):
            spans.append(SpanRecord(
                trace_id=tid.hex(), span_id=rng.randbytes(8).hex(),
                parent_span_id=rng.randbytes(8).hex(), name="chat gpt-4o-mini", kind=3,
                start_ns=now, end_ns=now + 10**6,
                attributes={"gen_ai.operation.name": "chat",
                            "gen_ai.request.model": "gpt-4o-mini"},
                resource={"service.name": "flood-svc"}))
    return proto_bytes(_with_content(spans, rng)), tids


def _grpc_sender(kind: str, address: str, seed: int, stop_at: float, out: Any) -> None:
    """One gRPC sender process: :data:`GRPC_THREADS` calls posting back to back."""
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        _grpc_sender_thread(kind, address, seed * 10 + i, stop_at)))
        for i in range(GRPC_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes: Counter[str] = Counter()
    for r in results:
        codes.update(r["codes"])
    out.put({"kind": kind, "codes": dict(codes), "no_hint": sum(r["no_hint"] for r in results)})


def _grpc_sender_thread(kind: str, address: str, seed: int, stop_at: float) -> dict[str, Any]:
    """Pre-encoded requests, fresh trace ids for every call."""
    templates = [_bulk_request(seed * 1000 + k, 6) if kind == "bulk"
                 else _flood_request(seed * 1000 + k, 10, 5) for k in range(8)]
    codes: Counter[str] = Counter()
    no_hint = 0
    rnd = random.Random(seed)
    channel = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
    export = channel.unary_unary(EXPORT_METHOD, request_serializer=None,
                                 response_deserializer=None)
    k = 0
    while time.monotonic() < stop_at:
        body, tids = templates[k % len(templates)]
        k += 1
        for t in tids:
            body = body.replace(t, rnd.randbytes(16))
        try:
            export(body, timeout=30)
            codes["grpc_OK"] += 1
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]
            codes[f"grpc_{code.name}"] += 1
            keys = {m.key for m in (err.trailing_metadata() or ())}  # type: ignore[attr-defined]
            if code == grpc.StatusCode.UNAVAILABLE and "google.rpc.retryinfo-bin" not in keys:
                no_hint += 1
    channel.close()
    return {"codes": dict(codes), "no_hint": no_hint}


def _build_loadgen(out_dir: Path) -> tuple[Path, float]:
    """``go build`` the load generator; (binary, seconds the build took). Skips the test
    when ``go`` is missing; a failed build fails it."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("the `go` command is not installed: this test builds its load generator "
                    "(tests/e2e/loadgen, Go standard library only) with it; CI has Go")
    binary = out_dir / "loadgen"
    # The flags of deploy/collector/build.sh (CGO off, -trimpath): on CI the standard
    # library is already in the default build cache. No module proxy, no toolchain
    # download: the generator needs the standard library only.
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOPROXY": "off",
           "GOWORK": "off", "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -buildvcs=false"}
    t0 = time.monotonic()
    res = subprocess.run([go, "build", "-trimpath", "-o", str(binary), "."], cwd=LOADGEN_SRC,
                         env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    assert res.returncode == 0, f"go build of tests/e2e/loadgen failed:\n{res.stderr[-3000:]}"
    return binary, took


def _write_bodies(out_dir: Path) -> tuple[Path, float]:
    """The flood's requests as NAME.pb (and their trace ids as NAME.tids, so the
    generator gives every post fresh ones): 12 of six 9-span runs, 4 of 50 orphan
    spans, all ~450 KB. Returns the directory and the mean spans per request."""
    out_dir.mkdir()
    spans = []
    for k in range(16):
        body, tids = _bulk_request(100 + k, 6) if k % 4 else _flood_request(100 + k, 10, 5)
        (out_dir / f"{k:02d}.pb").write_bytes(body)
        (out_dir / f"{k:02d}.tids").write_bytes(b"".join(tids))
        spans.append(body.count(b"gen_ai.input.messages"))
    return out_dir, statistics.mean(spans)


def _run_loadgen(binary: Path, address: str, bodies: Path, seconds: float, conns: int,
                 seed: int, source: str = "", sndbuf: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(binary), "-url", f"http://{address}/v1/traces", "-dir", str(bodies),
         "-duration", str(seconds), "-conns", str(conns), "-seed", str(seed),
         *(["-local", source] if source else []),
         *(["-sndbuf", str(sndbuf)] if sndbuf else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _loadgen_result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-2000:]
    result: dict[str, Any] = json.loads(out)
    return result


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_s() -> float:
    """CPU seconds the machine spent idle so far (all cores)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def _proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _counters(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) if fam.type == "counter"
            for s in fam.samples if s.name.endswith("_total")}


class Scraper(threading.Thread):
    """Prometheus, imitated: /metrics every 0.5 s, latencies and counter regressions."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{address}/metrics"
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.regressions: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        last: dict[Any, float] = {}
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=30) as r:
                    text = r.read().decode()
            except OSError as exc:
                self.failures.append(repr(exc))
                text = ""
            took = time.monotonic() - t0
            self.latencies.append(took)
            if text:
                now = _counters(text)
                for key, v in now.items():
                    if v < last.get(key, 0):
                        self.regressions.append(f"{key}: {last[key]} -> {v}")
                last.update(now)
            self.stop.wait(max(0.0, SCRAPE_EVERY - took))


class GoodAgent(threading.Thread):
    """A well-behaved agent: one run a second, each retried until accepted."""

    def __init__(self, address: str, runs: int) -> None:
        super().__init__(daemon=True)
        self.http = OtlpHttp(address)
        self.runs = runs
        self.accepted = 0
        self.refused = 0
        self.accepted_at: list[float] = []

    def run(self) -> None:
        for i in range(self.runs):
            t0 = time.monotonic()
            body = proto_bytes(_with_content(live_factory(50_000 + i, service="good-svc")
                                             .agent_run(genai_run_script(["lookup", "refund"],
                                                                         name=GOOD_AGENT),
                                                        "genai"), random.Random(i)))
            while True:
                try:
                    status = self.http.post(body).status
                except OSError:
                    status = 0
                if status == 200:
                    break
                self.refused += 1
                time.sleep(0.2)
            self.accepted += 1
            self.accepted_at.append(time.monotonic())
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        self.http.close()


def run_overload(tmp_path: Path, front: str,
                 addfinalizer: Callable[[Callable[[], object]], None]) -> SimpleNamespace:
    """Run the scenario with the senders sending to ``front`` and print what was measured;
    return the figures. ``admission``: through the shipped admission proxy
    (``deploy/admission/haproxy.cfg``, a real HAProxy) in front of the monitor, the
    deployment the 10x claim is made for (the test below); ``monitor``: straight at the
    monitor's receivers, whose own answers then bound the ratio (a measurement,
    ``python -m tests.benchmarks overload``)."""
    load_seconds = LOAD_SECONDS[front]
    t_start = time.monotonic()
    loadgen, build_s = _build_loadgen(tmp_path)
    bodies, spans_per_request = _write_bodies(tmp_path / "bodies")
    cfg = tmp_path / "monitor.yaml"
    cfg.write_text(CONFIG)
    mon = MonitorProcess("--config", str(cfg), "--log-level", "WARNING").start()
    assert mon.proc is not None
    pid = mon.proc.pid
    idle_kib = _proc_kib(pid, "VmRSS")

    # capacity: what the monitor accepts under a short saturating burst (straight at it)
    cpu0 = _cpu_s(pid)
    burst = _loadgen_result(_run_loadgen(loadgen, mon.addresses["otlp_http"], bodies,
                                         BURST_SECONDS, BURST_CONNS, seed=1), timeout=60)
    burst_cpu = (_cpu_s(pid) - cpu0) / burst["duration_s"]
    capacity = burst["codes"].get("200", 0) / burst["duration_s"]
    assert capacity > 0, burst
    time.sleep(2.0)  # the burst's runs close (grace 1 s) before the flood starts

    proxy = None
    http_address, grpc_address = mon.addresses["otlp_http"], mon.addresses["otlp_grpc"]
    flood_conns, source, sndbuf = FLOOD_CONNS, "", 0
    if front == "admission":
        proxy = AdmissionProxy(http_address, grpc_address)
        addfinalizer(proxy.stop)
        proxy.start()
        http_address, grpc_address = proxy.http, proxy.grpc
        flood_conns, source, sndbuf = ADMISSION_FLOOD_CONNS, FLOOD_SOURCE, FLOOD_SNDBUF
        proxy_cpu0 = _cpu_s(proxy.proc.pid) if proxy.proc else 0.0

    # the flood
    ctx = mp.get_context("fork")
    results: Any = ctx.Queue()
    stop_at = time.monotonic() + load_seconds
    flood = _run_loadgen(loadgen, http_address, bodies, load_seconds, flood_conns, seed=2,
                         source=source, sndbuf=sndbuf)
    cpu0, idle0, t0 = _cpu_s(pid), _idle_s(), time.monotonic()
    children0 = os.times()
    procs = [ctx.Process(target=_grpc_sender, daemon=True,
                         args=(kind, grpc_address, seed, stop_at, results))
             for kind, seed in (("bulk", 4), ("flood", 6))]
    for p in procs:
        p.start()
    scraper = Scraper(mon.addresses["metrics"])
    scraper.start()
    received0 = value(scrape(mon.addresses["metrics"]), "assaywatch_spans_received_total")
    good = GoodAgent(http_address, runs=int(load_seconds) - 5)
    good.start()
    rss_samples: list[int] = []
    while time.monotonic() < stop_at:
        rss_samples.append(_proc_kib(pid, "VmRSS"))
        time.sleep(1.0)
    lg = _loadgen_result(flood, timeout=60)
    load_s = time.monotonic() - t0
    flood_cpu = (_cpu_s(pid) - cpu0) / load_s
    proxy_cores = ((_cpu_s(proxy.proc.pid) - proxy_cpu0) / load_s
                   if proxy is not None and proxy.proc else 0.0)
    idle_cores = (_idle_s() - idle0) / load_s
    sent = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    children = os.times()
    # the gRPC senders and the load generator, all waited for by now
    senders_cores = (children.children_user + children.children_system
                     - children0.children_user - children0.children_system) / load_s
    load_end = time.monotonic()
    during = scraper.latencies[:]
    samples = scrape(mon.addresses["metrics"])
    accepted = value(samples, "assaywatch_spans_received_total") - received0

    # recovery: a fresh run is accepted at once and counted within seconds
    good.join(timeout=30)
    assert not good.is_alive()
    fresh = OtlpHttp(http_address)
    t0 = time.monotonic()
    reply = fresh.post(proto_bytes(live_factory(99_999, service="fresh-svc").agent_run(
        genai_run_script(["lookup"], name="fresh-agent"), "genai")))
    while reply.status != 200 and time.monotonic() - t0 < 10:
        time.sleep(0.2)
        reply = fresh.post(proto_bytes(live_factory(99_999, service="fresh-svc").agent_run(
            genai_run_script(["lookup"], name="fresh-agent"), "genai")))
    accepted_after = time.monotonic() - t0
    fresh.close()
    assert reply.status == 200
    counted_after = None
    while time.monotonic() - t0 < 20:
        s = scrape(mon.addresses["metrics"])
        if value(s, "assaywatch_runs_total", agent="fresh-agent") >= 1 and \
                value(s, "assaywatch_runs_total", agent=GOOD_AGENT) >= good.runs:
            counted_after = time.monotonic() - t0
            samples = s
            break
        time.sleep(0.2)
    drained_after = None
    while time.monotonic() - t0 < 45:
        s = scrape(mon.addresses["metrics"])
        if value(s, "assaywatch_pending_traces") < 100:  # the flood's wait for max age
            drained_after = time.monotonic() - t0
            break
        time.sleep(0.5)
    scraper.stop.set()
    scraper.join(timeout=30)
    hwm_mib = _proc_kib(pid, "VmHWM") / 1024
    proxy_refused = 0.0
    if proxy is not None:
        proxy_refused = proxy.answers_5xx()
        assert proxy.stop() in (0, -15), "the admission proxy did not stop on SIGTERM"
    code, stderr = mon.stop()

    codes: Counter[str] = Counter({f"http_{c}": n for c, n in lg["codes"].items()})
    for r in sent:
        codes.update(r["codes"])
    no_hint = lg["no_retry_after"] + sum(r["no_hint"] for r in sent)
    offered_rps = lg["requests"] / lg["duration_s"]
    flood_accepted_rps = lg["codes"].get("200", 0) / lg["duration_s"]
    ratio = offered_rps / max(capacity, flood_accepted_rps, 1e-9)
    lg_cores = lg["cpu_s"] / lg["duration_s"]
    # share of the flood the generator's connections spent waiting for an answer
    waiting = offered_rps * lg["latency_ms"]["mean"] / 1000 / flood_conns
    lat = sorted(during)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    dropped = {lab["reason"]: v for n, lab, v in samples
               if n == "assaywatch_spans_dropped_total"}
    rejected = {lab["reason"]: v for n, lab, v in samples
                if n == "assaywatch_spans_rejected_total" and v}
    print(f"\nloadgen: built in {build_s:.1f} s; requests of ~{spans_per_request:.0f} spans, "
          f"{lg['body_bytes_mean'] / 1024:.0f} KiB")
    print(f"capacity burst ({BURST_CONNS} connections, {burst['duration_s']:.1f} s): "
          f"{capacity:.0f} requests/s accepted (~{capacity * spans_per_request:.0f} spans/s), "
          f"answers {burst['codes']}; monitor CPU {burst_cpu:.2f} cores")
    print(f"front: {front}" + (f" (HAProxy {proxy_cores:.2f} cores; its 5xx answers "
                                f"{proxy_refused:.0f})" if front == "admission" else ""))
    print(f"flood ({flood_conns} connections, {lg['duration_s']:.1f} s): offered "
          f"{offered_rps:.0f} requests/s, accepted {flood_accepted_rps:.0f}/s: offered / "
          f"capacity x{ratio:.1f} (target x{TARGET_RATIO:g}); answers {lg['codes']}, "
          f"errors {lg['errors']}, connections opened {lg['connections_opened']}, latency "
          f"ms {({k: round(v) for k, v in lg['latency_ms'].items()})}")
    print(f"CPU during the flood: monitor {flood_cpu:.2f} cores, load generator "
          f"{lg_cores:.2f} (its connections waiting for answers {waiting:.0%} of the time), "
          f"gRPC senders {max(0.0, senders_cores - lg_cores):.2f}, machine "
          f"idle {idle_cores:.2f} of {os.cpu_count()}")
    print(f"all receivers: accepted {accepted / load_seconds:.0f} spans/s; answers "
          f"{dict(codes)}; 503/UNAVAILABLE without a retry hint: {no_hint}; rejected "
          f"{rejected}")
    print(f"memory: idle {idle_kib / 1024:.0f} MiB, VmRSS max "
          f"{max(rss_samples) / 1024:.0f} MiB, VmHWM {hwm_mib:.0f} MiB "
          f"(bound {RSS_BOUND_MIB} MiB)")
    print(f"/metrics during the load: {len(lat)} scrapes, median "
          f"{statistics.median(lat) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max "
          f"{lat[-1] * 1000:.0f} ms; counter regressions {len(scraper.regressions)}")
    print(f"good agent: {good.accepted}/{good.runs} accepted, {good.refused} refusals "
          f"retried; counted {value(samples, 'assaywatch_runs_total', agent=GOOD_AGENT):.0f}")
    def secs(t: float | None) -> str:
        return "never" if t is None else f"{t:.1f} s"

    print(f"recovery: fresh run accepted after {accepted_after:.1f} s, counted after "
          f"{secs(counted_after)}; pending traces drained after {secs(drained_after)}")
    print(f"dropped: {dropped}; test took {time.monotonic() - t_start:.0f} s "
          f"(load ended {load_end - t_start:.0f} s in)")

    refusals = codes["http_503"] + codes["grpc_UNAVAILABLE"]
    return SimpleNamespace(
        code=code, stderr=stderr, codes=codes, refusals=refusals,
        refused_share=refusals / max(1, sum(codes.values())), lg=lg, no_hint=no_hint,
        scraper=scraper, p99=p99, samples=samples, good=good, dropped=dropped,
        accepted_after=accepted_after, counted_after=counted_after,
        drained_after=drained_after, proxy_refused=proxy_refused, ratio=ratio,
        lg_cores=lg_cores, waiting=waiting, proxy_cores=proxy_cores, flood_cpu=flood_cpu,
        idle_cores=idle_cores, offered_rps=offered_rps, capacity=capacity,
        flood_accepted_rps=flood_accepted_rps, hwm_mib=hwm_mib)


def test_overload_at_ten_times_capacity_keeps_memory_metrics_and_other_senders_intact(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Through the admission proxy: the flood offers >= 10x the monitor's capacity and is
    refused with retry hints, while memory, /metrics and the well-behaved agent hold."""
    if haproxy_binary() is None:
        pytest.skip("the `haproxy` command is not installed: this test runs the shipped "
                    "admission proxy (deploy/admission/haproxy.cfg); CI installs Debian's "
                    "haproxy package")
    m = run_overload(tmp_path, "admission", request.addfinalizer)
    assert m.code == 0, m.stderr[-2000:]
    assert m.hwm_mib <= RSS_BOUND_MIB
    assert set(m.codes) <= ALLOWED_ANSWERS, m.codes
    assert not m.lg["errors"], m.lg["errors"]
    assert m.refusals > 0 and m.no_hint == 0
    assert not m.scraper.failures and not m.scraper.regressions, \
        (m.scraper.failures[:3], m.scraper.regressions[:3])
    assert m.p99 < 1.0
    assert value(m.samples, "assaywatch_runs_total", agent=GOOD_AGENT) == m.good.runs
    assert m.accepted_after < 5 and m.counted_after is not None and m.counted_after < 10
    assert m.drained_after is not None
    # the claim: through the admission proxy the senders offer >= 10x the capacity,
    # refused at the door (HAProxy's counter) and answered with retry hints (above)
    assert m.proxy_refused > 0
    assert m.ratio >= TARGET_RATIO, (
        f"offered x{m.ratio:.1f} the capacity through the admission proxy; load "
        f"generator {m.lg_cores:.2f} cores, HAProxy {m.proxy_cores:.2f}, monitor "
        f"{m.flood_cpu:.2f}, idle {m.idle_cores:.2f}")
    # at ten times the capacity most of what is sent is refused
    assert m.refused_share >= 0.5, "the senders did not overload the monitor"
