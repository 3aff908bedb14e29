"""A simulated tool-using agent that emits its runs through the real OpenTelemetry SDK.

Spans follow the GenAI semantic conventions (an ``invoke_agent`` root with ``chat`` and
``execute_tool`` children, token usage, evaluation attributes), so the monitor sees what a
real instrumented agent sends. The exporter is the real OTLP exporter (gRPC or HTTP).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode


@dataclass
class AgentBehaviour:
    pass_rate: float = 0.9
    tools: Mapping[str, float] = field(default_factory=lambda: {
        "lookup_order": 0.5, "search_kb": 0.3, "refund": 0.2})
    tool_calls: tuple[int, int] = (1, 3)
    latency_scale: float = 1.0
    error_rate: float = 0.02
    #: when set, each run carries a ``helpfulness`` evaluation score on its agent span:
    #: lumpy like a judge's (40% exactly 1.0, the rest uniform below), with this mean
    helpfulness: float | None = None


def make_provider(endpoint: str, protocol: str = "grpc", service: str = "support-svc",
                  ) -> tuple[TracerProvider, BatchSpanProcessor]:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=f"http://{endpoint}", insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter(endpoint=f"http://{endpoint}/v1/traces")
    provider = TracerProvider(resource=Resource.create({"service.name": service,
                                                        "service.version": "1.0"}))
    bsp = BatchSpanProcessor(exporter, max_queue_size=20_000, max_export_batch_size=512,
                             schedule_delay_millis=100)
    provider.add_span_processor(bsp)
    return provider, bsp


#: End of the last emitted run: the simulated process runs its agents one after another,
#: like one worker, so runs never overlap in (simulated) time and the order the monitor
#: closes them in is the order they ran in.
_last_end: dict[str, int] = {}


def emit_run(tracer: object, rng: np.random.Generator, agent: str, version: str,
             scenario: str, b: AgentBehaviour, t0_ns: int) -> int:
    """Emit one run starting at ``t0_ns`` (or just after the stream's previous run, if that
    is later); return its end time."""
    key = "process"
    t0_ns = max(t0_ns, _last_end.get(key, 0) + 1_000_000)
    tools = list(b.tools)
    weights = np.array([b.tools[t] for t in tools], dtype=float)
    weights /= weights.sum()
    n_tools = int(rng.integers(b.tool_calls[0], b.tool_calls[1] + 1))
    t = t0_ns
    root = tracer.start_span(  # type: ignore[attr-defined]
        f"invoke_agent {agent}", kind=SpanKind.INTERNAL, start_time=t,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
                    "gen_ai.agent.version": version, "assaywatch.scenario": scenario})
    from opentelemetry import trace

    ctx = trace.set_span_in_context(root)
    for i in range(n_tools + 1):
        dur = int(rng.lognormal(np.log(0.4e9), 0.3) * b.latency_scale)
        chat = tracer.start_span(  # type: ignore[attr-defined]
            "chat demo-model", context=ctx, kind=SpanKind.CLIENT, start_time=t,
            attributes={"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                        "gen_ai.request.model": "demo-model",
                        "gen_ai.response.model": "demo-model-2026",
                        "gen_ai.usage.input_tokens": int(rng.integers(200, 600)),
                        "gen_ai.usage.output_tokens": int(rng.integers(20, 200))})
        t += dur
        chat.end(end_time=t)
        if i == n_tools:
            break
        name = str(rng.choice(tools, p=weights))
        dur = int(rng.lognormal(np.log(0.2e9), 0.4) * b.latency_scale)
        tool = tracer.start_span(  # type: ignore[attr-defined]
            f"execute_tool {name}", context=ctx, start_time=t,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name})
        t += dur
        if rng.random() < b.error_rate:
            tool.set_status(Status(StatusCode.ERROR, "tool failed"))
            tool.set_attribute("error.type", "ToolError")
        tool.end(end_time=t)
    passed = bool(rng.random() < b.pass_rate)
    root.set_attribute("assaywatch.evaluation.passed", passed)
    if b.helpfulness is not None:
        # mean 0.4 + 0.6 * (c + (1 - c) / 2) with a share c at exactly 1.0
        share_top = min(1.0, max(0.0, (b.helpfulness - 0.7) / 0.3))
        score = 1.0 if rng.random() < share_top else float(0.4 + 0.6 * rng.random())
        root.set_attribute("gen_ai.evaluation.name", "helpfulness")
        root.set_attribute("gen_ai.evaluation.score.value", score)
    root.end(end_time=t)
    _last_end[key] = t
    return t


def sdk_runs(n: int, behaviour: AgentBehaviour, seed: int, *, agent: str = "support-agent",
             version: str = "1.0", scenarios: tuple[str, ...] = ("refund",),
             t0_ns: int = 1_760_000_000_000_000_000, gap_ns: int = 1_000_000_000,
             service: str = "support-svc") -> list[object]:
    """``n`` runs as finished spans of the real SDK (in its end order), for span files."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("assaywatch-tests")
    rng = np.random.default_rng(seed)
    t = t0_ns
    for i in range(n):
        t = emit_run(tracer, rng, agent, version, scenarios[i % len(scenarios)], behaviour,
                     t) + gap_ns
    provider.shutdown()
    return list(exporter.get_finished_spans())


class MonitorProcess:
    """``assaywatch monitor`` in a subprocess on free loopback ports."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.addresses: dict[str, str] = {}

    def entry(self) -> list[str]:
        """The command that runs ``assaywatch monitor`` (subclasses may run another)."""
        return [sys.executable, "-m", "assaywatch.monitor.commands.cli", "monitor"]

    def start(self, timeout: float = 30.0) -> MonitorProcess:
        cmd = [*self.entry(), "--otlp-grpc", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0",
               "--metrics", "127.0.0.1:0", *self.args]
        # stderr goes to a file: an unread pipe fills up under a chatty monitor and blocks it
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("assaywatch monitor listening"):
                for part in line.split()[3:]:
                    k, _, v = part.partition("=")
                    self.addresses[k] = v
                return self
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError(f"monitor did not start: {self._read_stderr()[-3000:]}")

    def _read_stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def url(self, path: str) -> str:
        return f"http://{self.addresses['metrics']}{path}"

    def stop(self, timeout: float = 30.0) -> tuple[int, str]:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
        return self.proc.returncode, self._read_stderr()
