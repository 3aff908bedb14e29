"""End to end: an OpenAI agent instrumented with the one import exports over real OTLP to a
real ``assaywatch monitor``, and shows up in /metrics as assembled runs with the right tools
and outcomes. The model is the loopback fake LLM server of conftest.py (no internet)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.otel_agent import MonitorProcess
from tests.e2e.test_monitor_e2e import wait_runs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

N_RUNS = 50
AGENT = textwrap.dedent(f'''
    import assaywatch.auto  # the one import, first line of the entry point

    import os

    import openai
    from opentelemetry import trace

    from assaywatch.instrumentation import agent_run, record_evaluation, tool

    client = openai.OpenAI(base_url=os.environ["FAKE_LLM"] + "/v1", api_key="test",
                           max_retries=0)
    TOOLS = [{{"type": "function", "function": {{
        "name": "get_weather", "description": "weather of a city",
        "parameters": {{"type": "object", "properties": {{"city": {{"type": "string"}}}}}}}}}}]

    @tool("get_weather")
    def get_weather(city: str) -> str:
        return f"sunny in {{city}}"

    for i in range({N_RUNS}):
        with agent_run("weather-agent", version="1.0", scenario="forecast") as run:
            messages = [{{"role": "user", "content": "weather in Paris?"}}]
            first = client.chat.completions.create(model="gpt-test", messages=messages,
                                                   tools=TOOLS)
            call = first.choices[0].message.tool_calls[0]
            result = get_weather("Paris")
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {{"role": "tool", "tool_call_id": call.id, "content": result}}]
            final = client.chat.completions.create(model="gpt-test", messages=messages,
                                                   tools=TOOLS)
            run.set_output(final.choices[0].message.content)
            record_evaluation(passed=i % 5 != 0)
    trace.get_tracer_provider().shutdown()
''')


def test_one_import_agent_shows_up_in_the_monitor(tmp_path: Path, fake_llm) -> None:
    cfg = tmp_path / "monitor.yaml"
    cfg.write_text("assembler:\n  grace_seconds: 0.5\ndetectors:\n  learn_runs: 40\n")
    mon = MonitorProcess("--config", str(cfg)).start()
    try:
        script = tmp_path / "agent.py"
        script.write_text(AGENT)
        env = {**os.environ, "FAKE_LLM": fake_llm.base_url,
               "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{mon.addresses['otlp_grpc']}",
               "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "weather-svc"}
        env.pop("OTEL_SDK_DISABLED", None)
        res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                             text=True, timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        # every run counted, then the stream calibrated (its coverage is exported once its
        # detectors run; the worker may still be calibrating when the last run arrives)
        samples = wait_runs(mon, {"weather-agent": N_RUNS}, timeout=60)
        runs = {lab["outcome"]: v for n, lab, v in samples
                if n == "assaywatch_runs_total" and lab["agent"] == "weather-agent"}
        # every run assembled once, its outcome from record_evaluation (1 in 5 fails)
        assert runs == {"pass": 40.0, "fail": 10.0, "unknown": 0.0}, runs
        labels = {(lab.get("version"), lab.get("scenario")) for n, lab, _ in samples
                  if n == "assaywatch_runs_total" and lab["agent"] == "weather-agent"}
        assert labels == {("1.0", "forecast")}
        # genai-openai records no tool definitions unless content capture is on, so the
        # stream has no inventory to measure tool coverage against: the dimension is not
        # exported (it would read 1.0, "fully covered"); paths and states are measured
        cov = {lab["dimension"]: v for n, lab, v in samples
               if n == "assaywatch_coverage_ratio" and lab["agent"] == "weather-agent"}
        assert set(cov) == {"path", "state", "overall"}, cov
        assert cov["path"] == 1.0  # every run took the same llm -> tool -> llm path
        with urllib.request.urlopen(mon.url("/api/streams"), timeout=10) as resp:
            streams = json.load(resp)["streams"]
        (stream,) = [s for s in streams if s["agent"] == "weather-agent"]
        assert stream["runs"] == N_RUNS and stream["baseline"]["runs"] == 40
    finally:
        code, err = mon.stop()
    assert code == 0, err[-2000:]
