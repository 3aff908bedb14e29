"""``assaywatch demo``: a monitor and an instrumented simulated support agent, on loopback.

The agent is written like a user's hand-written agent: ``agent_run`` for the run, ``tool``
for its tools and ``record_evaluation`` for the oracle, all from the public
``assaywatch.instrumentation`` API, exporting over real OTLP/gRPC to a monitor started in
this process with a temporary state dir. Its model calls are ``chat`` spans with the GenAI
attributes a model SDK's instrumentation would set (no model is called).

After ``--at`` runs the agent regresses the way the user picked:

``pass-rate``  the evaluator passes 70% of runs instead of 92%;
``tool-mix``   it searches the knowledge base instead of looking the order up: same number
               of tool calls, same pass rate — invisible to pass/fail, visible in the
               fingerprint;
``latency``    its tools become three times slower;
``none``       nothing changes (the detectors should stay quiet).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from opentelemetry import trace

REGRESSIONS = ("pass-rate", "tool-mix", "latency", "none")
AGENT = "support-agent"
VERSION = "1.0"
SCENARIO = "refund"


@dataclass
class Behaviour:
    pass_rate: float = 0.92
    tools: dict[str, float] = field(default_factory=lambda: {
        "lookup_order": 0.55, "search_kb": 0.25, "issue_refund": 0.20})
    tool_latency_s: float = 0.002


def regressed(kind: str) -> Behaviour:
    b = Behaviour()
    if kind == "pass-rate":
        b.pass_rate = 0.70
    elif kind == "tool-mix":
        b.tools = {"lookup_order": 0.05, "search_kb": 0.75, "issue_refund": 0.20}
    elif kind == "latency":
        b.tool_latency_s *= 3
    return b


class SupportAgent:
    """A simulated tool-using support agent instrumented with the public API."""

    def __init__(self, seed: int) -> None:
        from assaywatch.instrumentation import tool

        self.rng = random.Random(seed)
        self.behaviour = Behaviour()
        self.tracer = trace.get_tracer("assaywatch.demo")

        def make(name: str):  # type: ignore[no-untyped-def]
            @tool(name)
            def call(query: str) -> str:
                time.sleep(self.behaviour.tool_latency_s * self.rng.uniform(0.5, 1.5))
                return f"{name} result for {query}" * self.rng.randint(1, 4)
            return call

        self.tools = {name: make(name) for name in Behaviour().tools}

    def _chat(self, step: int) -> None:
        with self.tracer.start_as_current_span("chat demo-model", kind=trace.SpanKind.CLIENT,
                                               attributes={
                                                   "gen_ai.operation.name": "chat",
                                                   "gen_ai.provider.name": "openai",
                                                   "gen_ai.request.model": "demo-model",
                                               }) as span:
            time.sleep(0.001)
            span.set_attribute("gen_ai.response.model", "demo-model-2026-11")
            span.set_attribute("gen_ai.usage.input_tokens", 300 + 80 * step
                               + self.rng.randint(0, 120))
            span.set_attribute("gen_ai.usage.output_tokens", self.rng.randint(20, 160))

    def run_once(self, ticket: int) -> bool:
        from assaywatch.instrumentation import agent_run, record_evaluation

        b = self.behaviour
        names = list(b.tools)
        weights = [b.tools[n] for n in names]
        with agent_run(AGENT, version=VERSION, scenario=SCENARIO) as run:
            n_calls = self.rng.randint(1, 3)
            for step in range(n_calls):
                self._chat(step)
                name = self.rng.choices(names, weights)[0]
                self.tools[name](f"ticket {ticket}")
            self._chat(n_calls)
            run.set_output("Your refund is on its way." * self.rng.randint(1, 3))
            passed = self.rng.random() < b.pass_rate
            record_evaluation(passed=passed, name="demo-judge")
        return passed
