"""The hand-written agent API: agent_run, tool, record_evaluation, set_scenario; the
wrapper rule; idempotent instrument/uninstrument."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import StatusCode

from assaywatch.instrumentation import (
    agent_run,
    instrument,
    instrumented_frameworks,
    is_instrumented,
    record_evaluation,
    set_scenario,
    telemetry_errors,
    tool,
    uninstrument,
)
from assaywatch.instrumentation._safety import reset_telemetry_errors

Capture = Any


class AppError(Exception):
    """An application exception that must pass through unchanged."""


@tool
def lookup(key: str) -> str:
    return f"value-of-{key}"


@tool("search")
async def search(query: str) -> list[str]:
    await asyncio.sleep(0)
    return [query, query]


@tool("explode")
def explode() -> None:
    raise AppError("boom")


def test_sync_context_manager_with_tools(capture: Capture) -> None:
    instrument(tracer_provider=capture.provider)
    with agent_run("bot", version="2.1", scenario="refund") as run:
        assert lookup("a") == "value-of-a"
        assert lookup("bb") == "value-of-bb"
        run.set_output("final answer")
    root = capture.named("invoke_agent")[0]
    tools = capture.named("execute_tool")
    assert root.name == "invoke_agent bot" and root.parent is None
    assert (root.attributes or {})["gen_ai.agent.version"] == "2.1"
    assert (root.attributes or {})["assaywatch.scenario"] == "refund"
    assert (root.attributes or {})["assaywatch.output.length"] == len("final answer")
    assert [t.name for t in tools] == ["execute_tool lookup", "execute_tool lookup"]
    assert [(t.attributes or {})["assaywatch.output.length"] for t in tools] == [
        len("value-of-a"), len("value-of-bb")]
    assert all(t.parent is not None and t.parent.span_id == root.context.span_id
               for t in tools)
    assert all((t.attributes or {})["gen_ai.operation.name"] == "execute_tool" for t in tools)
    # no content without the opt-in
    assert all("gen_ai.tool.call.arguments" not in (t.attributes or {}) for t in tools)


def test_async_decorator_and_async_tool(capture: Capture) -> None:
    instrument(tracer_provider=capture.provider)

    @agent_run("async-bot")
    async def agent(q: str) -> str:
        hits = await search(q)
        return " ".join(hits)

    async def two_concurrent() -> list[str]:
        return list(await asyncio.gather(agent("x"), agent("yy")))

    assert asyncio.run(two_concurrent()) == ["x x", "yy yy"]
    roots = capture.named("invoke_agent")
    tools = capture.named("execute_tool")
    assert len(roots) == 2 and len(tools) == 2
    # each tool span is parented by its own run despite the interleaving
    parent_of = {t.context.span_id: t.parent.span_id for t in tools if t.parent}
    assert set(parent_of.values()) == {r.context.span_id for r in roots}
    lengths = sorted((r.attributes or {})["assaywatch.output.length"] for r in roots)
    assert lengths == [len("x x"), len("yy yy")]


def test_sync_decorator_and_async_context_manager(capture: Capture) -> None:
    instrument(tracer_provider=capture.provider)

    @agent_run("deco")
    def agent() -> str:
        return lookup("k")

    async def main() -> None:
        async with agent_run("acm", scenario="s") as run:
            run.set_output("xyz")

    assert agent() == "value-of-k"
    asyncio.run(main())
    names = sorted(s.name for s in capture.named("invoke_agent"))
    assert names == ["invoke_agent acm", "invoke_agent deco"]


def test_app_exceptions_pass_through_unchanged(capture: Capture) -> None:
    instrument(tracer_provider=capture.provider)
    with pytest.raises(AppError) as info:
        with agent_run("bot"):
            explode()
    assert str(info.value) == "boom" and type(info.value) is AppError
    tool_span = capture.named("execute_tool")[0]
    root = capture.named("invoke_agent")[0]
    for span in (tool_span, root):
        assert span.status.status_code is StatusCode.ERROR
        assert (span.attributes or {})["error.type"] == "AppError"
        assert [e.name for e in span.events] == ["exception"]


def test_record_evaluation_sets_attributes_and_event(capture: Capture) -> None:
    instrument(tracer_provider=capture.provider)
    with agent_run("bot"):
        assert record_evaluation(passed=False, score=0.25, label="fail", name="judge")
    root = capture.named("invoke_agent")[0]
    a = root.attributes or {}
    assert a["assaywatch.evaluation.passed"] is False
    assert a["gen_ai.evaluation.score.value"] == 0.25
    assert a["gen_ai.evaluation.score.label"] == "fail"
    assert a["gen_ai.evaluation.name"] == "judge"
    events = [e for e in root.events if e.name == "gen_ai.evaluation.result"]
    assert len(events) == 1
    assert (events[0].attributes or {})["gen_ai.evaluation.score.value"] == 0.25


def test_record_evaluation_inside_a_tool_targets_the_run(capture: Capture) -> None:
    instrument(tracer_provider=capture.provider)

    @tool("grader")
    def grader() -> None:
        record_evaluation(passed=True)

    with agent_run("bot"):
        grader()
    assert (capture.named("invoke_agent")[0].attributes or {})[
        "assaywatch.evaluation.passed"] is True
    assert "assaywatch.evaluation.passed" not in (capture.named("execute_tool")[0].attributes
                                                  or {})


def test_record_evaluation_validation_and_no_run(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="at least one"):
        record_evaluation()
    with pytest.raises(ValueError, match="finite"):
        record_evaluation(score=float("nan"))
    with caplog.at_level(logging.WARNING, logger="assaywatch.instrumentation"):
        assert record_evaluation(passed=True) is False
    assert "outside an active agent run" in caplog.text


def test_scenario_precedence(capture: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    instrument(tracer_provider=capture.provider)
    monkeypatch.setenv("ASSAYWATCH_SCENARIO", "from-env")

    def run_in_fresh_context() -> None:
        with agent_run("env"):
            pass
        set_scenario("outer")
        with agent_run("inherits"):
            with agent_run("nested"):
                pass
        with agent_run("explicit", scenario="arg") as run:
            set_scenario("changed")  # inside a run: that run only
        with agent_run("after"):
            pass
        assert run.scenario == "arg"

    import contextvars

    contextvars.copy_context().run(run_in_fresh_context)
    got = {s.name.split()[1]: (s.attributes or {}).get("assaywatch.scenario")
           for s in capture.named("invoke_agent")}
    assert got == {"env": "from-env", "inherits": "outer", "nested": "outer",
                   "explicit": "changed", "after": "outer"}


class _BrokenTracerProvider(TracerProvider):
    """A provider whose tracers fail on every span start: a broken telemetry pipeline."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        class Broken:
            def start_span(self, *a: Any, **k: Any) -> Any:
                raise RuntimeError("exporter exploded")

        return Broken()


def test_telemetry_failure_never_breaks_the_agent(caplog: pytest.LogCaptureFixture) -> None:
    reset_telemetry_errors()
    instrument(tracer_provider=_BrokenTracerProvider(), frameworks=[])
    try:
        with caplog.at_level(logging.ERROR, logger="assaywatch.instrumentation"):
            for _ in range(3):
                with agent_run("bot") as run:
                    assert lookup("q") == "value-of-q"
                    run.set_output("ok")
                    assert record_evaluation(passed=True) is False  # no live span: dropped
    finally:
        uninstrument()
    errors = telemetry_errors()
    assert errors["agent_run.start"] == 3 and errors["tool.start"] == 3
    logged = [r for r in caplog.records if "telemetry failed" in r.getMessage()]
    assert len(logged) == 2  # once per failing site, not once per failure


def test_instrument_is_idempotent_and_uninstrument_restores(capture: Capture) -> None:
    openai = pytest.importorskip("openai")
    from openai.resources.chat.completions import Completions

    original = Completions.create
    assert instrument(tracer_provider=capture.provider) is True
    assert instrument(tracer_provider=capture.provider) is False  # no-op
    assert is_instrumented()
    status = instrumented_frameworks()
    assert status["openai"] == "active" and status["anthropic"] == "active"
    wrapped = Completions.create
    assert wrapped is not original and wrapped.__wrapped__ is original
    uninstrument()
    assert not is_instrumented()
    assert Completions.create is original
    assert openai is not None
    with agent_run("after-uninstrument"):
        pass
    # our manual spans now go to the global provider (a no-op here), not the capture
    assert capture.named("invoke_agent") == []
    assert instrument(tracer_provider=capture.provider) is True  # and can come back
