"""Runs of a few simulated agents (the real OTel SDK, in memory), assembled offline as
``assaywatch replay`` does: the input of the fast scale-out tests."""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path

import numpy as np

from assaywatch.analyzers.model import Run
from assaywatch.monitor.config import MonitorConfig

CONFIG = MonitorConfig.from_mapping({"detectors": {
    "learn_runs": 40, "arl0": 200, "delta": 0.2, "hotelling_window": 30,
    "hotelling_every": 10}})


@functools.lru_cache(maxsize=1)
def recorded_runs(rounds: int = 90) -> tuple[Run, ...]:
    """Runs in replay order: four streams (one degrading, one changing its tools)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from assaywatch.monitor.offline.load import iter_runs
    from assaywatch.monitor.receivers.files import write_otlp_json_lines
    from tests.e2e.otel_agent import AgentBehaviour, emit_run

    provider = TracerProvider(resource=Resource.create({"service.name": "support-svc"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("fixture")
    rng = np.random.default_rng(17)
    good = AgentBehaviour(pass_rate=0.9)
    after = {"drop-agent": AgentBehaviour(pass_rate=0.3),
             "mix-agent": AgentBehaviour(tools={"lookup_order": 0.0, "search_kb": 0.1,
                                                "refund": 0.9}),
             "steady-a": good, "steady-b": good}
    for i in range(rounds):
        for agent, b in after.items():
            emit_run(tracer, rng, agent, "1.0", "refund", b if i >= 50 else good,
                     time.time_ns())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spans.jsonl"
        write_otlp_json_lines(str(path), memory.get_finished_spans())
        return tuple(iter_runs([str(path)]))
