"""Every conformance fixture, recorded from a real instrumentation package, replayed through
the pipeline the live monitor uses (receivers.files -> pipeline -> runs): the runs, stream
keys, steps by kind, tools, models, tokens and outcomes equal what a person wrote down in
``fixtures/NAME.expected.json`` from what the recording agent did."""

from __future__ import annotations

import pytest

from assaywatch.monitor.offline.load import load_runs
from tests.conformance.expected import Case, load_cases, sorted_dicts, summarize_run

CASES = load_cases()


def test_the_corpus_covers_every_instrumentation_the_issue_names() -> None:
    assert {c.name for c in CASES} >= {
        "openinference_openai_agent", "openinference_openai_bare",
        "openinference_langgraph_default", "openinference_langgraph_named", "traceloop_sdk",
        "otel_openai_v2_with_agent", "otel_openai_v2_bare", "langfuse_sdk",
        "openai_agents_sdk"}
    assert all(len(c.runs) == 3 for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture_gives_the_runs_a_person_counts(case: Case) -> None:
    runs, stats = load_runs([str(case.fixture)], strict=True)
    assert stats.dropped == {}, f"{case.name}: spans dropped {stats.dropped}"
    assert sorted_dicts(summarize_run(r) for r in runs) == case.expected_dicts()
