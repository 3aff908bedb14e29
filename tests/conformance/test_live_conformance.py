"""The real instrumentation packages, live, against a real ``assaywatch monitor``.

``test_live_monitor_counts_the_runs_a_person_counts``: per scenario, a monitor subprocess
on free loopback ports (assembler grace 0.5 s), the fake OpenAI server, and the scenario's
agent in its recording environment (``setup_envs.sh``: the pinned ``env-a`` / ``env-b``)
exporting over OTLP/HTTP protobuf (the real exporter behind a ``BatchSpanProcessor``) to
the monitor. Its ``/metrics`` and ``/api/streams`` must show the runs, stream keys and
outcomes of ``fixtures/NAME.expected.json``, and no span dropped as ``outside_run``.

``test_rerecorded_subset_still_assembles``: three representative scenarios re-recorded
with ``record.py`` in the newest-release environments (``env-latest``, ``env-latest-v2``:
``requirements-latest*.txt``, lower bounds only within the major version), replayed
through the offline loader against the same expectations, so that a new instrumentation
release that breaks run assembly fails CI.

Without the environments both tests skip with the command that creates them; when
``ASSAYWATCH_CONFORMANCE_ENVS`` is set (CI sets it after running ``setup_envs.sh``) a
missing environment fails instead. Inside the fresh-clone check's inner suite they skip:
the outer suite ran them.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from assaywatch.monitor.offline.load import load_runs
from tests.conformance import envs
from tests.conformance.expected import Case, load_cases, sorted_dicts, summarize_run
from tests.conformance.record import COMMON, PACKAGES, record, versions
from tests.e2e.otel_agent import MonitorProcess
from tests.e2e.rawotlp import Samples, scrape, value

pytestmark = [
    pytest.mark.e2e,
    # the fresh-clone check (tests/e2e/test_fresh_clone.py) runs the whole suite again in a
    # clone; these ran in the outer suite already, on the same environments
    pytest.mark.skipif(os.environ.get("ASSAYWATCH_FRESH_CLONE_INNER") == "1",
                       reason="ran in the suite around the fresh-clone check"),
]

CASES = load_cases()
#: Re-recorded by CI with the newest releases: a LangGraph graph through OpenInference
#: (the plumbing rules), Traceloop's workflow > agent > tool (entry-agent naming, scenario)
#: and the contrib openai-v2 package alone (a model call as the trace root).
RERECORD = ("openinference_langgraph_default", "traceloop_sdk", "otel_openai_v2_bare")
WAIT_S = 60.0
GRACE_S = 0.5


def _python(scenario: str, latest: bool = False) -> str:
    """The scenario's recording interpreter; skip (fail under CI) when it was not built."""
    found = envs.interpreter(scenario, latest=latest)
    if found is None:
        msg = f"{envs.env_name(scenario, latest)} missing for {scenario}: {envs.setup_hint()}"
        if os.environ.get(envs.ENV_VAR):
            pytest.fail(f"{envs.ENV_VAR} is set but {msg}")
        pytest.skip(msg)
    return str(found)


def _streams(mon: MonitorProcess) -> list[dict[str, Any]]:
    with urllib.request.urlopen(mon.url("/api/streams"), timeout=10) as r:
        return list(json.loads(r.read())["streams"])


def _expected_counts(case: Case) -> Counter[tuple[str, str, str, str]]:
    return Counter((r.agent, r.version, r.scenario, r.outcome) for r in case.runs)


def _run_counts(samples: Samples) -> Counter[tuple[str, str, str, str]]:
    out: Counter[tuple[str, str, str, str]] = Counter()
    for name, labels, v in samples:
        if name == "assaywatch_runs_total" and v:
            out[(labels["agent"], labels["version"], labels["scenario"],
                 labels["outcome"])] += int(v)
    return out


def _spans_in(path: Path) -> int:
    """Spans in an OTLP/JSON Lines file: what the agent also sent live."""
    n = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            n += sum(len(ss.get("spans", ())) for rs in json.loads(line)["resourceSpans"]
                     for ss in rs.get("scopeSpans", ()))
    return n


def _dropped(samples: Samples) -> dict[str, float]:
    return {labels["reason"]: v for name, labels, v in samples
            if name == "assaywatch_spans_dropped_total" and v}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_live_monitor_counts_the_runs_a_person_counts(case: Case, tmp_path: Path) -> None:
    python = _python(case.name)
    cfg = tmp_path / "monitor.yaml"
    cfg.write_text(f"assembler:\n  grace_seconds: {GRACE_S}\n")
    mon = MonitorProcess("--config", str(cfg), "--log-level", "WARNING").start()
    try:
        endpoint = f"http://{mon.addresses['otlp_http']}"
        status, detail = record(case.name, tmp_path, len(case.runs), python,
                                otlp_endpoint=endpoint)
        assert status == "recorded", f"{case.name}: {status}: {detail}"
        want = _expected_counts(case)
        sent = _spans_in(tmp_path / f"{case.name}.jsonl")
        deadline = time.monotonic() + WAIT_S
        while True:
            samples = scrape(mon.addresses["metrics"])
            done = (value(samples, "assaywatch_spans_received_total") >= sent
                    and value(samples, "assaywatch_pending_traces") == 0
                    and sum(_run_counts(samples).values()) >= len(case.runs))
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if done:  # one more look past the grace: no run may still be on its way
            time.sleep(GRACE_S + 0.5)
            samples = scrape(mon.addresses["metrics"])
        streams = _streams(mon)
    finally:
        code, stderr = mon.stop()
    got = _run_counts(samples)
    context = (f"{case.name}: {sent} spans sent, "
               f"{value(samples, 'assaywatch_spans_received_total'):g} received; monitor "
               f"streams {streams}, dropped {_dropped(samples)}, stderr: {stderr[-2000:]}")
    assert sum(got.values()) == len(case.runs) == 3, context
    assert got == want, context
    assert {(s["agent"], s["version"], s["scenario"]) for s in streams} == {
        k[:3] for k in want}, context
    assert Counter({(s["agent"], s["version"], s["scenario"]): s["runs"] for s in streams}) \
        == Counter({k[:3]: n for k, n in want.items()}), context
    assert value(samples, "assaywatch_spans_dropped_total", reason="outside_run") == 0, context
    assert code == 0, context
    # the file written beside the live export holds the same runs (the offline path)
    runs, _ = load_runs([str(tmp_path / f"{case.name}.jsonl")], strict=True)
    assert sorted_dicts(summarize_run(r) for r in runs) == case.expected_dicts()


@pytest.mark.parametrize("name", RERECORD)
def test_rerecorded_subset_still_assembles(name: str, tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == name)
    python = _python(name, latest=True)
    status, detail = record(name, tmp_path, len(case.runs), python)
    used = versions(python, PACKAGES[name] + COMMON)
    assert status == "recorded", f"{name} with {used}: {status}: {detail}"
    runs, stats = load_runs([str(tmp_path / f"{name}.jsonl")], strict=True)
    assert stats.dropped == {}, f"{name} with {used}: spans dropped {stats.dropped}"
    assert sorted_dicts(summarize_run(r) for r in runs) == case.expected_dicts(), (
        f"{name} re-recorded with {used} no longer gives the runs a person counts "
        f"(fixtures/{name}.expected.json; pinned versions: {case.recorded_with})")
