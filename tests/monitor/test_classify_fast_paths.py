"""The assembler's shortcuts change no fact. ``classify`` answers at once from the first
key of a look-up and skips look-ups whose keys a span does not carry: here the cases where
the first key does not settle it (empty, wrong type, later key), and the key sets the skips
rely on (``values.*_SOURCES``: every key the skipped function would look at first). Nodes
take their resource's names from ``resource_names``; runs build steps positionally, in
``Step``'s field order."""

from __future__ import annotations

import dataclasses

from assaywatch.analyzers.model import Step
from assaywatch.monitor.pipeline.normalize import Kind, classify
from assaywatch.monitor.pipeline.outcome import Evaluation
from assaywatch.monitor.pipeline.runs import STEP_FIELDS, resource_names
from assaywatch.monitor.pipeline.values import (
    COST_SOURCES,
    EVALUATION_SOURCES,
    OUTPUT_LENGTH_SOURCES,
    cost_of,
    evaluation_of,
    output_length_of,
)
from assaywatch.monitor.receivers.spans import AttrValue, SpanRecord
from tests.monitor.test_read_keys import Recording

CHAT = {"gen_ai.operation.name": "chat"}


def span(attrs: dict[str, AttrValue], name: str = "s", parent: str = "p" * 16) -> SpanRecord:
    return SpanRecord("t" * 32, "s" * 16, parent, name, 0, 1, attributes=attrs)


def test_the_skip_sets_hold_every_key_the_skipped_functions_look_at_first() -> None:
    for fn, keys in ((output_length_of, OUTPUT_LENGTH_SOURCES), (cost_of, COST_SOURCES),
                     (evaluation_of, EVALUATION_SOURCES)):
        attrs = Recording({}, set())
        assert fn(attrs) is None  # a span without any of them: nothing to find
        assert attrs.seen <= keys, (fn.__name__, attrs.seen - keys)


def test_token_counts_fall_back_as_first_value_and_as_int_do() -> None:
    def tokens(**attrs: AttrValue) -> tuple[int, int]:
        n = classify(span({**CHAT, **{k.replace("__", "."): v for k, v in attrs.items()}}))
        return n.input_tokens, n.output_tokens

    assert tokens(gen_ai__usage__input_tokens=12, gen_ai__usage__output_tokens=3) == (12, 3)
    assert tokens(gen_ai__usage__input_tokens=-5) == (0, 0)
    assert tokens(gen_ai__usage__input_tokens=True) == (0, 0)  # a bool is no count
    assert tokens(gen_ai__usage__input_tokens="12", gen_ai__usage__output_tokens=7.9) == (12, 7)
    # an empty first key gives way to the next one
    assert tokens(gen_ai__usage__input_tokens="", gen_ai__usage__prompt_tokens=8) == (8, 0)
    assert tokens(llm__token_count__completion=4) == (0, 4)
    details = '{"input": 30, "output": 5}'
    assert tokens(langfuse__observation__usage_details=details) == (30, 5)


def test_names_fall_back_past_empty_and_non_string_first_keys() -> None:
    n = classify(span({**CHAT, "gen_ai.provider.name": "", "gen_ai.system": "az.ai.openai",
                       "gen_ai.response.model": "", "gen_ai.request.model": "gpt-4o"}))
    assert (n.provider, n.model) == ("azure.ai.openai", "gpt-4o")
    n = classify(span({**CHAT, "gen_ai.response.model": 5, "gen_ai.provider.name": True}))
    assert (n.model, n.provider) == ("5", None)  # first_value keeps True; as_str drops it
    n = classify(span({**CHAT, "assaywatch.scenario": "", "gen_ai.workflow.name": "refund"}))
    assert n.scenario == "refund"
    tool = classify(span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "",
                          "tool.name": "lookup"}))
    assert (tool.kind, tool.tool) == (Kind.TOOL, "lookup")
    handoff = classify(span({"gen_ai.operation.name": "execute_tool",
                             "gen_ai.tool.name": "transfer_to_billing"}))
    assert (handoff.kind, handoff.tool) == (Kind.HANDOFF, "billing")
    custom = classify(span({"gen_ai.operation.name": 3, "openinference.span.kind": "TOOL"},
                           name="search"))
    assert (custom.kind, custom.tool) == (Kind.TOOL, "search")


def test_skipped_look_ups_still_find_a_single_late_key() -> None:
    assert classify(span({**CHAT, "gen_ai.completion.0.content": "abcd",
                          "gen_ai.usage.output_tokens": 9})).output_length == 4
    assert classify(span({**CHAT, "gen_ai.usage.output_tokens": 9})).output_length == 9
    lf = classify(span({**CHAT, "langfuse.observation.cost_details": '{"total": 0.5}'}))
    assert lf.cost_usd == 0.5
    assert classify(span(CHAT)).cost_usd is None
    n = classify(span({**CHAT, "assaywatch.evaluation.passed": "false"}))
    assert n.evaluations == (Evaluation(name=None, label=None, score=None, passed=False),)
    assert classify(span({**CHAT, "gen_ai.evaluation.name": "x"})).evaluations == ()


def test_resource_names_are_the_non_empty_string_names() -> None:
    assert resource_names({"service.name": "svc", "service.version": "1.2"}) == ("svc", "1.2")
    assert resource_names({"service.name": "", "service.version": 3}) == (None, None)
    assert resource_names({}) == (None, None)


def test_runs_build_steps_in_the_field_order_of_step() -> None:
    assert tuple(f.name for f in dataclasses.fields(Step)) == STEP_FIELDS
