"""CPU time per span of each stage of the monitor's ingest path, in one process.

The requests are ``bench_monitor``'s (:class:`~tests.benchmarks.bench_monitor.RequestPool`:
56 realistic 9-span GenAI runs, 504 spans a request). Each request goes through the
stages the live monitor runs, in the same order and with the same objects, timed with
``time.process_time`` (CPU time of this process, so work done elsewhere on a shared
machine does not count):

``decode``
    ``decode_proto_request`` with the receivers' limits: the monitor's ``keep_keys`` /
    ``keep_prefixes`` (the keys the pipeline reads), ``max_spans`` and ``max_elements``.
``queue bytes``
    ``batch_bytes``: the queue's byte estimate ``Pipeline.offer`` computes.
``assembler add``
    ``Assembler.add`` (classification, grouping, byte accounting) of the pipeline.
``close + runs``
    ``Assembler.poll`` after the grace time: closing the traces and building their runs.
``engine``
    The pipeline handing the closed runs to the engine (``Pipeline._process_runs``),
    the stream's baseline frozen and its detectors built beforehand (as
    ``bench_monitor`` warms up).
``write-ahead log``
    Only with a state dir (``--state-dir``, as deploy/ runs the monitor), so not in the
    sum: ``encode_batch`` and ``WriteAheadLog.append`` of the decoded batch to a log in
    a temporary directory, as ``Pipeline.offer`` does before acknowledging it (the fsync
    once a second, the default, is the log's own thread's: its little CPU time lands in
    whichever stage runs meanwhile). Printed beside the sum with the share it implies.

The ceiling is ``bench_monitor``'s: protobuf's ``ParseFromString`` and the Python decoder's
walk of every attribute into records (``records_from_request`` with default limits), the
capacity goal's yardstick, kept when the monitor's path decodes with the compiled decoder
(``assaywatch_native``, native/; the first line printed says which). Its CPU time per span
over the sum of the stages is the share of the ceiling one monitor core could reach at
best (receiving the request over HTTP/gRPC, thread hand-offs and the metrics port are not
counted, so the end-to-end share measured by ``bench_monitor`` is lower). Protobuf's
``ParseFromString`` alone is shown beside it: the C part of decoding, a yardstick for
comparing runs.
The garbage collector runs with the monitor's policy (``service/gc_policy.py``). Medians
over :data:`REPEATS` rounds of :data:`REQUESTS` requests, with the lowest and highest
round; the ceilings are timed request by request beside the stages, and each stage is
also given as a multiple of the ceiling of its round, which load from other processes
disturbs less than the microseconds.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from collections.abc import Callable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.pipeline.normalize import monitor_decode_limits
from assaywatch.monitor.receivers.otlp.bounds import DEFAULT_MAX_ELEMENTS
from assaywatch.monitor.receivers.otlp.decode import (
    DecodeLimits,
    decode_proto_request,
    native_available,
    records_from_request,
)
from assaywatch.monitor.receivers.spans import IngestCounters
from assaywatch.monitor.service import gc_policy
from assaywatch.monitor.service.pipeline import Pipeline, batch_bytes
from assaywatch.monitor.service.wal import WriteAheadLog, encode_batch
from tests.benchmarks.bench_monitor import RUNS_PER_REQUEST, SPANS_PER_RUN, RequestPool

#: Rounds, and requests per round (504 spans each).
REPEATS = 15
REQUESTS = 6
#: The throughput configuration of bench_monitor.
CONFIG = {"assembler": {"grace_seconds": 0.2, "max_pending_traces": 100_000},
          "ingest": {"queue_max_spans": 200_000}, "detectors": {"learn_runs": 100}}
STAGES = ("decode", "queue bytes", "assembler add", "close + runs", "engine")
#: With a state dir only: not in the sum of STAGES.
WAL_STAGE = "write-ahead log"
SPANS = RUNS_PER_REQUEST * SPANS_PER_RUN


def python_walk(body: bytes) -> None:
    """The ceiling: upb's parse and the Python walk of every attribute into records (the
    Python decoder with default limits), whichever decoder the monitor's path uses."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    records_from_request(req)


class _Clock:
    """The assembler's clock, moved by hand: each request's traces close at the next poll."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_pipeline(config: MonitorConfig, clock: _Clock) -> Pipeline:
    engine = Engine(config.detectors, [], max_streams=config.limits.max_streams,
                    stream_idle_seconds=config.limits.stream_idle_seconds,
                    replace_idle_seconds=config.limits.replace_idle_seconds,
                    idle_clock=time.time_ns, score_shift=config.evaluations.min_drop,
                    score_threshold=config.evaluation_threshold,
                    verdict_window_s=config.evaluations.join_window_seconds)
    return Pipeline(config, engine, IngestCounters(), clock=clock)


def one_request(body: bytes, pipe: Pipeline, clock: _Clock, limits: DecodeLimits,
                max_spans: int, wal: WriteAheadLog | None = None,
                ) -> tuple[list[float], int]:
    """(CPU seconds per stage, runs) for one request through the monitor's stages, and
    last the write-ahead log's when ``wal`` is given."""
    cpu = time.process_time
    grace = pipe.config.assembler.grace_seconds
    t0 = cpu()
    spans = decode_proto_request(body, limits, max_spans=max_spans,
                                 max_elements=DEFAULT_MAX_ELEMENTS).spans
    t1 = cpu()
    batch_bytes(spans)
    t2 = cpu()
    if wal is not None:
        wal.append(encode_batch("grpc", spans))
    t_logged = cpu()
    pipe.assembler.add(spans)
    t3 = cpu()
    clock.now += grace + 0.01
    runs = pipe.assembler.poll()
    t4 = cpu()
    pipe._process_runs(runs)  # noqa: SLF001 (the pipeline thread's own call)
    t5 = cpu()
    return [t1 - t0, t2 - t1, t3 - t_logged, t4 - t3, t5 - t4, t_logged - t2], len(runs)


def measure(repeats: int = REPEATS, requests: int = REQUESTS,
            report: Callable[[str], None] = print) -> dict[str, list[float]]:
    """Per-span CPU microseconds of every stage and of the ceilings, one value per round."""
    config = MonitorConfig.from_mapping(CONFIG)
    # as Monitor.decode_limits with a state dir: classified spans keep their attributes
    # (the log needs them). Without one the monitor drops them after classifying, which
    # a single-process timing barely sees: what it saves is the memory they hold while
    # the span waits in the queue (bench_monitor measures that path live).
    limits = monitor_decode_limits(config.streams.key_attributes)
    pool = RequestPool()
    clock = _Clock()
    pipe = make_pipeline(config, clock)
    max_spans = min(100_000, pipe.capacity_spans)
    # warm-up: the stream learns its baseline, freezes and calibrates (inline)
    warm = pool.build(config.detectors.learn_runs // RUNS_PER_REQUEST + 2, start=0)
    for b in warm:
        one_request(b, pipe, clock, limits, max_spans)
    pipe.engine.wait_calibrations()
    stream = pipe.engine.streams()[0]
    assert stream.baseline is not None and not stream.calibrating, "baseline not frozen"
    bodies = pool.build(repeats * requests, start=len(warm))
    ceiling_bodies = pool.build(requests, start=10**6)
    cpu = time.process_time
    before = gc.get_threshold()
    gc_policy.tune()
    out: dict[str, list[float]] = {s: [] for s in (*STAGES, WAL_STAGE, "ceiling", "parse")}
    runs = 0
    state = tempfile.TemporaryDirectory()
    wal = WriteAheadLog(state.name)
    wal.open()
    try:
        for r in range(repeats):
            sums = [0.0] * (len(STAGES) + 1)
            ceiling = parse = 0.0
            for i, b in enumerate(bodies[r * requests:(r + 1) * requests]):
                dt, n = one_request(b, pipe, clock, limits, max_spans, wal)
                runs += n
                sums = [a + x for a, x in zip(sums, dt, strict=True)]
                # the ceilings request by request, beside the path: all see the same load
                t0 = cpu()
                python_walk(ceiling_bodies[i])
                t1 = cpu()
                ExportTraceServiceRequest().ParseFromString(ceiling_bodies[i])
                ceiling += t1 - t0
                parse += cpu() - t1
            n_spans = requests * SPANS
            for s, v in zip((*STAGES, WAL_STAGE), sums, strict=True):
                out[s].append(1e6 * v / n_spans)
            out["ceiling"].append(1e6 * ceiling / n_spans)
            out["parse"].append(1e6 * parse / n_spans)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        wal.close()
        state.cleanup()
    expected = repeats * requests * RUNS_PER_REQUEST
    if runs != expected:
        raise RuntimeError(f"expected {expected} runs, the pipeline closed {runs}")
    if pipe.runs_processed < expected:
        raise RuntimeError(f"the engine processed {pipe.runs_processed} runs")
    return out


def _row(name: str, values: list[float], ceiling: list[float]) -> str:
    rel = [v / c for v, c in zip(values, ceiling, strict=True)]
    return (f"{name:<34s} {statistics.median(values):9.2f} {min(values):8.2f} "
            f"{max(values):8.2f} {statistics.median(rel):10.2f}")


def main() -> None:
    out = measure()
    totals = [sum(out[s][i] for s in STAGES) for i in range(len(out["decode"]))]
    ceiling = out["ceiling"]
    print("decoder on the monitor's path: "
          + ("compiled (assaywatch_native)" if native_available() else "Python (upb + walk)"))
    print(f"CPU microseconds per span (time.process_time), {REPEATS} rounds of "
          f"{REQUESTS} requests x {SPANS} spans; 'x ceiling': the stage over the ceiling "
          "of the same round (steadier than microseconds on a shared machine)")
    print(f"{'stage':<34s} {'median':>9s} {'min':>8s} {'max':>8s} {'x ceiling':>10s}")
    for s in STAGES:
        print(_row(s, out[s], ceiling))
    print(_row("end to end (sum of the stages)", totals, ceiling))
    print(_row(f"{WAL_STAGE} (state dir only)", out[WAL_STAGE], ceiling))
    print(_row("ceiling: parse + Python walk", ceiling, ceiling))
    print(_row("ceiling: ParseFromString", out["parse"], ceiling))
    ratios = [100 * c / t for c, t in zip(out["ceiling"], totals, strict=True)]
    print(f"implied end to end / ceiling: {statistics.median(ratios):.0f}% "
          f"(rounds {min(ratios):.0f}-{max(ratios):.0f}%; an upper bound: receiving and "
          "thread hand-offs not counted); goal >= 50%")
    durable = [100 * c / (t + w) for c, t, w in zip(out["ceiling"], totals, out[WAL_STAGE],
                                                    strict=True)]
    print(f"with a state dir (the write-ahead log added): {statistics.median(durable):.0f}% "
          f"(rounds {min(durable):.0f}-{max(durable):.0f}%)")


if __name__ == "__main__":
    main()
