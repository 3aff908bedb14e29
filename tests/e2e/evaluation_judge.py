"""An LLM-as-judge evaluator in its own process, publishing through the real OTel SDK logs API.

``python -m tests.e2e.evaluation_judge --endpoint HOST:PORT ...`` reads one JSON line per
finished agent run on stdin (``trace_id``, ``span_id`` of the evaluated root span, hex;
``scenario``; ``index``, the run's index in its stream; ``at``, when the run was scheduled
to end, in seconds since the agent started), draws a delay uniformly in
``[--min-delay, --max-delay]`` seconds and, when it is due, emits one
``gen_ai.evaluation.result`` event (``gen_ai.evaluation.name``,
``gen_ai.evaluation.score.value``, ``gen_ai.evaluation.explanation``) **in the context of
the evaluated span**: a ``NonRecordingSpan`` of the run's remote ``SpanContext`` passed to
``Logger.emit(context=...)``, so the SDK stamps the log record with the run's trace and span
ids, as a judge running in another service would. The records go through the SDK's
``BatchLogRecordProcessor`` and the real OTLP log exporter (gRPC or HTTP).

Scores are lumpy like a real judge's: :data:`TOP_SHARE` of them exactly 1.0, the rest on
the levels :data:`LEVELS` (probabilities :data:`BASELINE`). From run ``--change-at`` on, a
scenario named in ``--change SCENARIO=MODE`` is scored lower by about 0.1 (same share of
passes): ``lumpy`` keeps the share of perfect 1.0 marks and draws the rest from
:data:`DEGRADED` (:func:`population_mean`); ``notch`` scores every answer one level lower
(1.0 becomes 0.9, never below 0.5; :func:`notch_mean`). Every score is >= 0.5, so an
evaluation could never turn a run's outcome (``evaluation_threshold`` 0.5) even if it rode
on its trace: the agent's pass rate is the agent's alone.

When stdin closes the judge waits for its last due evaluation, flushes, and writes a JSON
report to ``--report``: what it emitted (scenario, index, score, delay, wall time of the
emit and the run id ``<trace_id>:<span_id>``, in emit order) and how many records the
exporter reported exported and failed.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult

#: Share of scores that are exactly 1.0, before and after the change.
TOP_SHARE = 0.45
#: Score levels below 1.0.
LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9)
#: Probabilities of :data:`LEVELS` for an unchanged judge ...
BASELINE = (0.05, 0.10, 0.15, 0.35, 0.35)
#: ... and after the change (the same share of 1.0, the rest lower).
DEGRADED = (0.40, 0.35, 0.10, 0.10, 0.05)
EVENT_NAME = "gen_ai.evaluation.result"
#: Written into every explanation: the monitor must never store it.
EXPLANATION_MARKER = "JUDGE-RATIONALE-7f3a"


def population_mean(degraded: bool) -> float:
    """The mean score the judge draws from."""
    probs = DEGRADED if degraded else BASELINE
    return TOP_SHARE + (1 - TOP_SHARE) * float(np.dot(LEVELS, probs))


def notch_mean() -> float:
    """The mean score of the ``notch`` judge (every score one level lower, at least 0.5)."""
    below = [max(LEVELS[0], round(x - 0.1, 1)) for x in LEVELS]
    return 0.9 * TOP_SHARE + (1 - TOP_SHARE) * float(np.dot(below, BASELINE))


def draw_score(rng: np.random.Generator, mode: str) -> float:
    """One score of the judge: ``mode`` ``baseline``, ``lumpy`` (the same share of 1.0,
    the rest drawn from :data:`DEGRADED`) or ``notch`` (a baseline score one level lower,
    1.0 becoming 0.9, at least 0.5)."""
    top = rng.random() < TOP_SHARE
    rest = float(rng.choice(LEVELS, p=DEGRADED if mode == "lumpy" else BASELINE))
    if mode == "notch":
        return 0.9 if top else max(LEVELS[0], round(rest - 0.1, 1))
    return 1.0 if top else rest


class _CountingExporter(LogRecordExporter):
    """The real OTLP log exporter, counting what it reports exported and failed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.exported = 0
        self.failed = 0

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        result = self.inner.export(batch)
        if result is LogRecordExportResult.SUCCESS:
            self.exported += len(batch)
        else:
            self.failed += len(batch)
        return result  # type: ignore[no-any-return]

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def _exporter(endpoint: str, protocol: str) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

        return OTLPLogExporter(endpoint=f"http://{endpoint}", insecure=True, timeout=10)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogExporter,
    )

    return HttpLogExporter(endpoint=f"http://{endpoint}/v1/logs", timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--evaluator", default="helpfulness")
    ap.add_argument("--change", action="append", default=[], metavar="SCENARIO=MODE",
                    help="from --change-at on, runs of SCENARIO are scored by MODE "
                    "(lumpy or notch)")
    ap.add_argument("--change-at", type=int, required=True)
    ap.add_argument("--min-delay", type=float, default=1.0)
    ap.add_argument("--max-delay", type=float, default=60.0)
    ap.add_argument("--report", required=True, help="file the final JSON report goes to")
    args = ap.parse_args(argv)
    modes = dict(c.split("=", 1) for c in args.change)
    if not set(modes.values()) <= {"lumpy", "notch"}:
        ap.error(f"--change modes are lumpy or notch, got {modes}")

    from opentelemetry import trace
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    exporter = _CountingExporter(_exporter(args.endpoint, args.protocol))
    provider = LoggerProvider(resource=Resource.create({"service.name": "judge-svc",
                                                        "service.version": "1.0"}))
    provider.add_log_record_processor(BatchLogRecordProcessor(
        exporter, schedule_delay_millis=100, max_export_batch_size=256,
        max_queue_size=20_000))
    judge = provider.get_logger("assaywatch-tests.judge")
    rng = np.random.default_rng(args.seed)

    due: list[tuple[float, int, dict[str, Any]]] = []
    cond = threading.Condition()
    eof = threading.Event()
    origin: list[float] = []

    def read() -> None:
        for n, line in enumerate(sys.stdin):
            if not line.strip():
                continue
            item = json.loads(line)
            changed = int(item["index"]) >= args.change_at
            item["score"] = draw_score(rng, modes.get(item["scenario"], "baseline")
                                       if changed else "baseline")
            item["delay"] = float(rng.uniform(args.min_delay, args.max_delay))
            # due at the run's scheduled end ("at", seconds since the agent started) plus
            # the delay: the order of the evaluations depends on the seed only
            if not origin:
                origin.append(time.monotonic() - float(item["at"]))
            with cond:
                heapq.heappush(due, (origin[0] + float(item["at"]) + item["delay"], n, item))
                cond.notify()
        with cond:
            eof.set()
            cond.notify()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    print("judge ready", flush=True)
    emitted: list[tuple[str, int, float, float, float, str]] = []
    while True:
        with cond:
            while not due and not eof.is_set():
                cond.wait()
            if not due:
                break
            wait = due[0][0] - time.monotonic()
            if wait > 0:
                cond.wait(timeout=wait)
                continue
            _, _, item = heapq.heappop(due)
        ctx = trace.set_span_in_context(NonRecordingSpan(SpanContext(
            trace_id=int(item["trace_id"], 16), span_id=int(item["span_id"], 16),
            is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))
        now_ns = time.time_ns()
        judge.emit(timestamp=now_ns, context=ctx, event_name=EVENT_NAME, attributes={
            "gen_ai.evaluation.name": args.evaluator,
            "gen_ai.evaluation.score.value": item["score"],
            "gen_ai.evaluation.explanation":
                f"{EXPLANATION_MARKER}: the answer cites the refund policy",
        })
        emitted.append((item["scenario"], int(item["index"]), item["score"], item["delay"],
                        now_ns / 1e9, f'{item["trace_id"]}:{item["span_id"]}'))
    provider.force_flush()
    provider.shutdown()
    with open(args.report, "w", encoding="utf-8") as fh:
        json.dump({"emitted": emitted, "exported": exporter.exported,
                   "failed": exporter.failed}, fh)
    print("judge done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
