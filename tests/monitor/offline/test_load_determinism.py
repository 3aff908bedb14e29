"""Offline loading is a pure function of the spans: the same spans in any record order,
batching or file split give the same runs, and the same gate decision and p-values.

The spans come from the real OTel SDK (tests/e2e/otel_agent.py's simulated support agent);
``write_otlp_json_lines`` writes any subset of them as one OTLP JSON line, so the tests can
re-batch and shuffle them freely: one span per line, one trace per line, everything in one
line, lines in random order, runs split across two files, gzip or not.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assaywatch.monitor.commands._common import build_baselines
from assaywatch.monitor.commands.cli import main
from assaywatch.monitor.offline.gate import GatePolicy, decide
from assaywatch.monitor.offline.load import load_runs
from assaywatch.monitor.receivers.files import write_otlp_json_lines
from tests.e2e.otel_agent import AgentBehaviour, sdk_runs

N_RUNS = 60


def runs_as_spans(n: int, pass_rate: float, seed: int, version: str) -> list[Any]:
    """``n`` runs of the support agent as finished SDK spans, in the SDK's end order; runs
    0.2 s apart, closer than the monitor's 5 s grace, so a time-based loader would have to
    get the interleaving right."""
    return sdk_runs(n, AgentBehaviour(pass_rate=pass_rate), seed, version=version,
                    gap_ns=200_000_000)


@functools.cache
def spans_of(which: str) -> list[Any]:
    if which == "baseline":
        return runs_as_spans(N_RUNS, 0.9, seed=11, version="1.0")
    return runs_as_spans(N_RUNS, 0.8, seed=12, version="1.1")


@functools.cache
def reference(tmp: str) -> tuple[Any, list[Any]]:
    """(baselines, candidate runs) read from one SDK export each, as the SDK wrote them."""
    d = Path(tmp)
    base_path, cand_path = d / "base.jsonl", d / "cand.jsonl"
    write_otlp_json_lines(str(base_path), spans_of("baseline"))
    write_otlp_json_lines(str(cand_path), spans_of("candidate"))
    return build_baselines(load_runs([str(base_path)])[0]), load_runs([str(cand_path)])[0]


@pytest.fixture(scope="module")
def baseline_spans() -> list[Any]:
    return spans_of("baseline")


def summary(runs: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.run_id, r.key, r.outcome, r.start_ns, r.end_ns,
             tuple((s.action, s.tool, s.input_tokens, s.output_tokens) for s in r.steps))
            for r in runs]


def write_batched(path: Path, spans: list[Any], batch: int, shuffle_seed: int | None,
                  by_trace: bool = False) -> None:
    spans = list(spans)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(spans)
    if by_trace:
        groups: dict[int, list[Any]] = {}
        for s in spans:
            groups.setdefault(s.context.trace_id, []).append(s)
        chunks = list(groups.values())
    else:
        chunks = [spans[i:i + batch] for i in range(0, len(spans), batch)]
    for chunk in chunks:
        write_otlp_json_lines(str(path), chunk)


def test_each_run_of_an_sdk_export_is_read(tmp_path: Path,
                                           baseline_spans: list[Any]) -> None:
    path = tmp_path / "runs.jsonl"
    write_otlp_json_lines(str(path), baseline_spans)
    runs, stats = load_runs([str(path)])
    assert len(runs) == N_RUNS
    assert stats.dropped == {}


def test_baseline_build_reads_every_run_of_a_60_run_capture(
        tmp_path: Path, baseline_spans: list[Any]) -> None:
    # a BatchSpanProcessor exports whatever ended since its last export: batches cut
    # traces anywhere (7 spans here, runs have 4-6), the first one included
    path = tmp_path / "capture.jsonl.gz"
    write_batched(path, baseline_spans, 7, None)
    out = tmp_path / "baseline.json"
    assert main(["baseline", "build", str(path), "-o", str(out)]) == 0
    (b,) = json.loads(out.read_text())["baselines"]
    assert b["n_runs"] == N_RUNS


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.sampled_from([1, 3, 7, 50, 10_000]), seed=st.integers(0, 10_000),
       by_trace=st.booleans(), split=st.booleans(), gz=st.booleans())
def test_any_order_and_batching_gives_the_same_runs_and_decision(
        tmp_path_factory: pytest.TempPathFactory, batch: int, seed: int, by_trace: bool,
        split: bool, gz: bool) -> None:
    baselines, expected = reference(str(tmp_path_factory.getbasetemp()))
    d = tmp_path_factory.mktemp("perm")
    suffix = ".jsonl.gz" if gz else ".jsonl"
    spans = list(spans_of("candidate"))
    random.Random(seed).shuffle(spans)
    if split:  # the same spans over two files, a trace possibly cut in two
        paths = [d / f"a{suffix}", d / f"b{suffix}"]
        half = len(spans) // 2
        write_batched(paths[0], spans[:half], batch, seed, by_trace)
        write_batched(paths[1], spans[half:], batch, seed + 1, by_trace)
    else:
        paths = [d / f"c{suffix}"]
        write_batched(paths[0], spans, batch, seed, by_trace)
    runs, stats = load_runs([str(p) for p in paths])
    assert summary(runs) == summary(expected)
    assert stats.dropped == {}

    policy = GatePolicy()
    a = decide(baselines, expected, policy)
    b = decide(baselines, runs, policy)
    assert (a.decision, a.exit_code) == (b.decision, b.exit_code)
    assert [(s.name, [(t.name, t.verdict, t.statistics) for t in s.tests]) for s in a.streams] \
        == [(s.name, [(t.name, t.verdict, t.statistics) for t in s.tests]) for s in b.streams]
