"""A simulated tool-using agent for the live gate, instrumented with assaywatch only.

Behaviour from the environment (set by the tests):

``SIM_PASS_RATE``  probability that a run passes (recorded with ``record_evaluation``)
``SIM_TOOLS``      tool mix, ``name:weight,name:weight``
``SIM_SEED``       base seed; each run draws from (seed, scenario, run index)
``SIM_CRASH``      probability that an invocation exits with code 7 before any run, drawn
                   from (seed, scenario, run index) so a test knows which ones crash
``SIM_VERSION``    agent version (default 1.0)
``SIM_PROXY``      ``1``: run as the cheaper proxy of the same agent (``gate --proxy-run``):
                   same steps and the same per-input draws as the target on the same
                   (seed, scenario, index), tokens times ``SIM_PROXY_COST`` (default 0.1),
                   and a pass decided by the target's own uniform with probability
                   ``SIM_PROXY_CORR`` (default 0.9), by a fresh one otherwise, against
                   ``SIM_PROXY_PASS_RATE`` (default ``SIM_PASS_RATE``): pass/fail
                   correlation SIM_PROXY_CORR when the two pass rates are equal

It runs once per invocation, or loops on ``run <scenario> <index>`` lines of stdin when the
gate sets ``ASSAYWATCH_LOOP=1`` (the live gate's protocol, monitor/live/runner.py).
``instrument(frameworks=[])`` configures the SDK from the OTEL_* variables without
importing any agent framework, so start-up stays fast.
"""

from __future__ import annotations

import os
import random
import sys
import zlib

from opentelemetry import trace

from assaywatch.instrumentation import agent_run, instrument, record_evaluation, tool


def one_run(scenario: str, index: int) -> None:
    seed = int(os.environ.get("SIM_SEED", "0"))
    rng = random.Random(zlib.crc32(f"{seed}/{scenario}/{index}".encode()))
    pass_rate = float(os.environ.get("SIM_PASS_RATE", "0.9"))
    mix = [(n, float(w)) for n, _, w in
           (p.partition(":") for p in os.environ.get("SIM_TOOLS", "search:1").split(","))]
    proxy = os.environ.get("SIM_PROXY") == "1"
    scale = float(os.environ.get("SIM_PROXY_COST", "0.1")) if proxy else 1.0
    tracer = trace.get_tracer("sim-agent")
    with agent_run("sim-agent", version=os.environ.get("SIM_VERSION", "1.0"),
                   scenario=scenario or None) as run:
        for _ in range(rng.randint(1, 3)):
            with tracer.start_as_current_span("chat sim-model", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": "sim-model",
                    "gen_ai.usage.input_tokens": round(rng.randint(200, 400) * scale),
                    "gen_ai.usage.output_tokens": round(rng.randint(20, 80) * scale)}):
                pass
            name = rng.choices([n for n, _ in mix], weights=[w for _, w in mix])[0]
            tool(name)(lambda: "x" * rng.randint(50, 150))()
        run.set_output("answer " * rng.randint(5, 15))
        u = rng.random()
        if proxy:
            own = random.Random(zlib.crc32(f"proxy/{seed}/{scenario}/{index}".encode()))
            if own.random() >= float(os.environ.get("SIM_PROXY_CORR", "0.9")):
                u = own.random()
            pass_rate = float(os.environ.get("SIM_PROXY_PASS_RATE", str(pass_rate)))
        record_evaluation(passed=u < pass_rate)


def write_spans(path: str, n: int, scenarios: list[str]) -> None:
    """Baseline mode: ``sim_agent.py --spans FILE N [SCENARIO ...]`` writes N runs per
    scenario as OTLP JSON Lines, for ``assaywatch baseline build``."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from assaywatch.monitor.receivers.files.otlp_json import write_otlp_json_lines

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    for sc in scenarios or [""]:
        for i in range(n):
            one_run(sc, 1_000_000 + i)  # indices apart from the live runs'
    write_otlp_json_lines(path, list(exporter.get_finished_spans()))


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--spans":
        write_spans(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
        return
    crash = float(os.environ.get("SIM_CRASH", "0"))
    draw = random.Random(f"{os.environ.get('SIM_SEED', '0')}:"
                         f"{os.environ.get('ASSAYWATCH_SCENARIO', '')}:"
                         f"{os.environ.get('ASSAYWATCH_RUN_INDEX', '0')}:crash").random()
    if draw < crash:
        print("sim_agent: simulated crash before any run", file=sys.stderr)
        sys.exit(7)
    instrument(frameworks=[])
    scenario = os.environ.get("ASSAYWATCH_SCENARIO", "")
    if os.environ.get("ASSAYWATCH_LOOP") != "1":
        one_run(scenario, int(os.environ.get("ASSAYWATCH_RUN_INDEX", "0")))
        return
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 3 or parts[0] != "run":
            continue
        one_run("" if parts[1] == "-" else parts[1], int(parts[2]))
        trace.get_tracer_provider().force_flush()  # type: ignore[attr-defined]
        print("done", flush=True)


if __name__ == "__main__":
    main()
