"""Offline replay and gate at scale: throughput, wall time and memory as the input grows.

Spans come from the simulated agent of tests/e2e/otel_agent.py through the real OTel SDK
(an in-memory exporter), written as OTLP JSON Lines (one line per 500 runs, like the file
exporter) and as Collector length-prefixed proto frames. Measured:

* replay throughput (spans/s) of ``assaywatch.monitor.offline.replay.replay`` with the
  default monitor config, from JSON Lines and from proto;
* ``assaywatch gate`` wall time (reading both inputs, baseline build, tests) for 10,000
  baseline runs vs 10,000 candidate runs, and ``decide`` alone on the loaded runs;
* peak RSS of a fresh ``assaywatch replay`` subprocess on 1x (1,000 runs) and 10x (10,000
  runs) of the same stream: replay streams the file and keeps bounded state, so the peak
  should stay flat, not grow tenfold.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RUNS_1X = 1_000
RUNS_10X = 10_000
PER_LINE = 500


def _write(dirpath: Path, name: str, n: int, seed: int,
           version: str) -> tuple[Path, Path, int]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from assaywatch.monitor.receivers.files import write_otlp_json_lines, write_proto_frame
    from tests.e2e.otel_agent import AgentBehaviour, emit_run

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench-replay")
    rng = np.random.default_rng(seed)
    jsonl, proto = dirpath / f"{name}.jsonl", dirpath / f"{name}.pb"
    b = AgentBehaviour(pass_rate=0.9)
    t = 1_790_000_000_000_000_000 + seed * 10**15
    total = 0
    with open(proto, "wb") as fh:
        for i in range(n):
            t = emit_run(tracer, rng, "bench-agent", version, "refund", b, t) + 10**9
            if (i + 1) % PER_LINE == 0 or i + 1 == n:
                spans = exporter.get_finished_spans()
                exporter.clear()
                total += write_otlp_json_lines(str(jsonl), spans)
                write_proto_frame(fh, encode_spans(spans).SerializeToString())
    provider.shutdown()
    return jsonl, proto, total


def _replay_rate(path: Path) -> tuple[float, int, int, float]:
    from assaywatch.monitor.config import MonitorConfig
    from assaywatch.monitor.offline.replay import replay

    t0 = time.perf_counter()
    res = replay([str(path)], MonitorConfig())
    dt = time.perf_counter() - t0
    return res.stats.spans / dt, res.stats.spans, res.stats.runs, dt


def _peak_memory_mb(path: Path) -> tuple[float, float]:
    """(peak RSS, tracemalloc peak of the replay itself) of a fresh subprocess, in MB. The
    RSS includes the interpreter and the imported libraries; tracemalloc isolates what the
    replay allocates (started after the imports)."""
    code = ("import contextlib, io, resource, tracemalloc\n"
            "from assaywatch.monitor.commands.cli import main\n"
            "import assaywatch.monitor.offline.replay, assaywatch.monitor.commands.replay\n"
            "tracemalloc.start()\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main(['replay', {str(path)!r}])\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
            " tracemalloc.get_traced_memory()[1])")
    rss, traced = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True, cwd=os.getcwd()).stdout.split()[-2:]
    return int(rss) / 1024, int(traced) / 2**20  # Linux reports ru_maxrss in KiB


def main() -> None:
    from assaywatch.monitor.commands._common import build_baselines
    from assaywatch.monitor.commands.cli import main as cli
    from assaywatch.monitor.offline.gate import GatePolicy, decide
    from assaywatch.monitor.offline.load import load_runs

    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        d = Path(tmp)
        t0 = time.perf_counter()
        j1, _, s1 = _write(d, "base1x", RUNS_1X, 1, "1.0")
        j10, p10, s10 = _write(d, "base10x", RUNS_10X, 2, "1.0")
        # The candidate: the 10x runs re-labelled as version 1.1 (same size and shape of
        # input; generating another 10,000 runs through the SDK would double the setup).
        jc = d / "cand10x.jsonl"
        jc.write_text(j10.read_text().replace('{"stringValue":"1.0"}', '{"stringValue":"1.1"}'))
        gen = time.perf_counter() - t0
        print(f"replay benchmark (inputs generated in {gen:.1f} s through the OTel SDK)")
        print(f"{'measure':46s} {'value':>14s}")
        for label, path in (("JSON Lines", j10), ("proto frames", p10)):
            rate, spans, runs, dt = _replay_rate(path)
            print(f"{'replay ' + label + f' ({runs} runs, {spans} spans)':46s} "
                  f"{rate:>10,.0f} sp/s  ({dt:.2f} s)")
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli(["gate", "--baseline", str(j10), "--candidate", str(jc), "--quiet"])
        gate_s = time.perf_counter() - t0
        label = f"gate CLI 10,000 vs 10,000 runs (exit {code})"
        print(f"{label:46s} {gate_s:>12.2f} s")
        base_runs, _ = load_runs([str(j10)])
        cand_runs, _ = load_runs([str(jc)])
        t0 = time.perf_counter()
        baselines = build_baselines(base_runs)
        decide(baselines, cand_runs, GatePolicy())
        print(f"{'  of which baseline build + decide':46s} {time.perf_counter() - t0:>12.2f} s")
        (r1, m1), (r10, m10) = _peak_memory_mb(j1), _peak_memory_mb(j10)
        for label, rss, traced in ((f"replay 1x ({s1} spans)", r1, m1),
                                   (f"replay 10x ({s10} spans)", r10, m10)):
            print(f"{'peak RSS ' + label:46s} {rss:>11.1f} MB")
            print(f"{'peak allocated by the replay ' + label[7:]:46s} {traced:>11.1f} MB")
        print(f"{'  ratio 10x / 1x (RSS, allocated)':46s} {r10 / r1:>6.2f} {m10 / m1:>6.2f}")
