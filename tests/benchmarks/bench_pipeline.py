"""Normalizer + assembler throughput and the memory held by pending traces.

Throughput: pre-built 9-span runs (root, retrieval, 4 LLM calls, 3 tools; see
``tests.monitor.spanfactory.nine_span_agent``) in each dialect, fed in batches of 512 spans
through ``Assembler.add`` and closed by ``flush`` -- classification, grouping, run building
and the oracle, everything after protocol decoding. Memory: tracemalloc peak of the
assembler's own allocations while 10,000 traces are pending (the span records themselves
are built before tracing starts, as a receiver would hand them over and drop them).
"""

from __future__ import annotations

import time
import tracemalloc

from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.normalize import classify
from assaywatch.monitor.receivers.spans import SpanRecord
from tests.monitor.spanfactory import DIALECTS, SpanFactory, nine_span_agent

RUNS = 2_000
BATCH = 512
PENDING = 10_000


def _spans(dialect: str, n_runs: int, seed: int = 0) -> list[SpanRecord]:
    f = SpanFactory(seed=seed)
    script = nine_span_agent()
    return [s for _ in range(n_runs) for s in f.agent_run(script, dialect)]


def _throughput(spans: list[SpanRecord]) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    for s in spans:
        classify(s)
    t_classify = time.perf_counter() - t0
    asm = Assembler(clock=lambda: 0.0, max_pending_traces=RUNS + 1)
    t0 = time.perf_counter()
    for i in range(0, len(spans), BATCH):
        asm.add(spans[i:i + BATCH])
    runs = asm.flush()
    t_all = time.perf_counter() - t0
    return len(spans) / t_classify, len(spans) / t_all, len(runs)


def main() -> None:
    print(f"{'dialect':<18}{'classify spans/s':>18}{'assemble spans/s':>18}"
          f"{'runs/s':>10}{'runs':>7}")
    for dialect in DIALECTS:
        spans = _spans(dialect, RUNS)
        best = max((_throughput(spans) for _ in range(2)), key=lambda r: r[1])
        c, a, n = best
        print(f"{dialect:<18}{c:>18,.0f}{a:>18,.0f}{a / 9:>10,.0f}{n:>7}")
    spans = _spans("genai", PENDING, seed=1)
    asm = Assembler(clock=lambda: 0.0, max_pending_traces=PENDING)
    tracemalloc.start()
    for i in range(0, len(spans), BATCH):
        asm.add(spans[i:i + BATCH])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert asm.pending_traces == PENDING
    print(f"\npending traces: {asm.pending_traces:,} x 9 spans; tracemalloc peak "
          f"{peak / 2**20:.1f} MiB ({peak / PENDING / 1024:.2f} KiB per trace, "
          f"{peak / len(spans):.0f} B per span)")


if __name__ == "__main__":
    main()
