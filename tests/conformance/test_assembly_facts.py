"""Run facts of the conformance fixtures beyond the person's counts: the same runs when the
spans carry only the keys the live monitor decodes (``READ_KEYS`` / ``READ_PREFIXES``),
plumbing that is no nesting level, and the tool inventory where the package records one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from assaywatch.monitor.offline.load import load_runs
from assaywatch.monitor.pipeline.assemble import assemble_all
from assaywatch.monitor.pipeline.dialects import READ_KEYS, READ_PREFIXES
from assaywatch.monitor.pipeline.normalize import monitor_decode_limits
from assaywatch.monitor.receivers.files import read_spans
from assaywatch.monitor.receivers.otlp.decode import NATIVE_ENV, decode_proto_request
from assaywatch.monitor.receivers.spans import AttrValue, SpanEvent, SpanRecord
from tests.conformance.expected import Case, load_cases, sorted_dicts, summarize_run
from tests.e2e.rawotlp import request_from_records
from tests.monitor.decoders import NATIVE_INSTALLED

CASES = load_cases()
#: The tools offered to the model, where the package records them on the wire:
#: ``gen_ai.tool.definitions`` (Traceloop's openai instrumentation) and OpenInference's
#: ``llm.tools.<i>.tool.json_schema``. The LangGraph fixtures hide inputs (and with them
#: the tools); openai-v2 2.4b0 and the genai openai-agents packages record none; Langfuse
#: keeps them inside the generation's input content, which the monitor never reads.
INVENTORY = {"traceloop_sdk": "get_weather", "openinference_openai_agent": "get_weather"}


def _live(span: SpanRecord) -> SpanRecord:
    def keep(attrs: dict[str, AttrValue]) -> dict[str, AttrValue]:
        return {k: v for k, v in attrs.items() if k in READ_KEYS or k.startswith(READ_PREFIXES)}

    return replace(span, attributes=keep(span.attributes), resource=keep(span.resource),
                   events=[SpanEvent(e.name, e.time_ns, keep(e.attributes))
                           for e in span.events])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_live_monitors_decoded_keys_give_the_same_runs(case: Case) -> None:
    spans = [_live(s) for batch in read_spans([str(case.fixture)], strict=True)
             for s in batch]
    runs = assemble_all(spans)
    assert sorted_dicts(summarize_run(r) for r in runs) == case.expected_dicts()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_steps_sit_right_below_the_run_and_the_inventory_is_read(case: Case) -> None:
    runs, _ = load_runs([str(case.fixture)], strict=True)
    for run in runs:
        # Single-agent scripts: plumbing and the workflow's entry agent are no level.
        assert {s.depth for s in run.steps} == {1}, case.name
        assert run.attributes.get("assaywatch.tool_inventory") == INVENTORY.get(case.name)


@pytest.mark.skipif(not NATIVE_INSTALLED, reason="the compiled decoder is not installed "
                    "(pip install ./native, needs Rust)")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_compiled_decoders_classified_spans_give_the_same_runs(
        case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """The captures sent as OTLP protobuf and decoded by the compiled decoder with the live
    monitor's limits: the spans it classified while decoding (``SpanRecord.norm``) and
    the others give the runs the person's counts expect. GenAI-convention captures have
    such spans; a span carrying an OpenInference, Traceloop or Langfuse key has none."""
    monkeypatch.setenv(NATIVE_ENV, "1")
    spans = [s for batch in read_spans([str(case.fixture)], strict=True) for s in batch]
    body = request_from_records(spans).SerializeToString()
    decoded = decode_proto_request(body, monitor_decode_limits()).spans
    assert len(decoded) == len(spans)
    runs = assemble_all(decoded)
    assert sorted_dicts(summarize_run(r) for r in runs) == case.expected_dicts()
    classified = [s for s in decoded if s.norm is not None]
    if case.name.startswith(("otel_openai_v2", "openai_agents_sdk")):
        assert classified, case.name
    assert not any(k.startswith(("openinference.", "traceloop.", "langfuse."))
                   for s in classified for k in s.attributes), case.name
