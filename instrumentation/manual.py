"""Hand-written agents: ``agent_run``, ``tool``, ``record_evaluation``, ``set_scenario``.

Spans follow the GenAI semantic conventions (shared/reference/otel-conventions.md 1.1):
the run is an INTERNAL ``invoke_agent {name}`` span carrying ``gen_ai.agent.name``,
optional ``gen_ai.agent.version`` and ``assaywatch.scenario``; each tool call is an
INTERNAL ``execute_tool {tool}`` span with ``gen_ai.tool.name``. LLM calls made inside a
run by an instrumented SDK become ``chat`` children automatically (they start in the
run's context).

The wrapper rule holds everywhere: the application's exception is recorded on the span
(status ERROR, ``error.type`` = exception class name, an ``exception`` event) and
re-raised unchanged; a failure of our own telemetry is logged once and counted
(:mod:`assaywatch.instrumentation._safety`) and the application carries on.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from assaywatch.instrumentation import attributes as A
from assaywatch.instrumentation._safety import guarded, logger, report

F = TypeVar("F", bound=Callable[..., Any])

_SCOPE = "assaywatch.instrumentation"
_provider: trace.TracerProvider | None = None
_tracer: Tracer | None = None


@dataclass
class _RunState:
    span: Span
    name: str


_current_run: ContextVar[_RunState | None] = ContextVar("assaywatch_run", default=None)
_scenario: ContextVar[str | None] = ContextVar("assaywatch_scenario", default=None)


def set_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Use ``provider`` for our spans (None: the global provider, resolved per span)."""
    global _provider, _tracer
    _provider = provider
    _tracer = None


def _get_tracer() -> Tracer:
    global _tracer
    if _provider is None:
        # Resolved each time: the app may install its provider after importing us.
        return trace.get_tracer(_SCOPE)
    if _tracer is None:
        _tracer = trace.get_tracer(_SCOPE, tracer_provider=_provider)
    return _tracer


def current_scenario() -> str | None:
    """The scenario key in force here: the innermost ``set_scenario``/``agent_run``, else
    the ``ASSAYWATCH_SCENARIO`` variable, else None."""
    return _scenario.get() or os.environ.get(A.ENV_SCENARIO) or None


def _capture_content() -> bool:
    return bool(A.content_on_spans(os.environ.get(A.ENV_CAPTURE_CONTENT)))


def _text_length(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(str(value))


def _record_error(span: Span, exc: BaseException) -> None:
    with guarded("record_error"):
        span.record_exception(exc)
        span.set_attribute(A.ERROR_TYPE, type(exc).__qualname__)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__qualname__}: {exc}"[:200]))


class AgentRun:
    """One agent run: the ``invoke_agent`` span, usable as context manager or decorator.

    Use ``with agent_run("support-bot", scenario="refund") as run:`` (or ``async with``)
    around the agent's work, calling ``run.set_output(answer)`` to record the answer's
    length; or decorate the agent's entry function with ``@agent_run("support-bot")``
    (sync or async), which records the length of ``str(return value)``.
    """

    def __init__(self, name: str, *, version: str | None = None,
                 scenario: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"agent_run needs a non-empty agent name, got {name!r}")
        self.name = name
        self.version = version
        self.scenario = scenario
        self.span: Span = trace.INVALID_SPAN
        self._tokens: tuple[object, Token[_RunState | None], Token[str | None]] | None = None

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> AgentRun:
        if self._tokens is not None:
            raise RuntimeError(
                f"agent_run({self.name!r}) is already active; create one per run "
                "(or use it as a decorator, which makes one per call)"
            )
        scenario = self.scenario or current_scenario()
        span: Span = trace.INVALID_SPAN
        with guarded("agent_run.start"):
            attrs: dict[str, Any] = {A.GEN_AI_OPERATION_NAME: A.OP_INVOKE_AGENT,
                                     A.GEN_AI_AGENT_NAME: self.name}
            if self.version:
                attrs[A.GEN_AI_AGENT_VERSION] = self.version
            if scenario:
                attrs[A.SCENARIO] = scenario
            span = _get_tracer().start_span(f"invoke_agent {self.name}", kind=SpanKind.INTERNAL,
                                            attributes=attrs)
        self.span = span
        ctx_token = otel_context.attach(trace.set_span_in_context(span))
        self._tokens = (ctx_token, _current_run.set(_RunState(span, self.name)),
                        _scenario.set(scenario))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        tokens, self._tokens = self._tokens, None
        if exc is not None:
            _record_error(self.span, exc)
        with guarded("agent_run.end"):
            self.span.end()
        if tokens is not None:
            ctx_token, run_token, scenario_token = tokens
            with guarded("agent_run.detach"):
                _scenario.reset(scenario_token)
                _current_run.reset(run_token)
                otel_context.detach(ctx_token)  # type: ignore[arg-type]
        return None

    async def __aenter__(self) -> AgentRun:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- handle methods -------------------------------------------------------------------
    def set_output(self, output: Any) -> None:
        """Record the run's final output: its character length always, the text only with
        the content opt-in."""
        with guarded("agent_run.set_output"):
            self.span.set_attribute(A.OUTPUT_LENGTH, _text_length(output))
            if _capture_content():
                msg = [{"role": "assistant", "parts": [{"type": "text", "content": str(output)}]}]
                self.span.set_attribute(A.GEN_AI_OUTPUT_MESSAGES, json.dumps(msg))

    def set_scenario(self, scenario: str) -> None:
        """Set this run's scenario key."""
        with guarded("agent_run.set_scenario"):
            self.span.set_attribute(A.SCENARIO, scenario)

    # -- decorator ------------------------------------------------------------------------
    def __call__(self, func: F) -> F:
        spec = (self.name, self.version, self.scenario)
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def arun(*args: Any, **kwargs: Any) -> Any:
                async with AgentRun(spec[0], version=spec[1], scenario=spec[2]) as run:
                    result = await func(*args, **kwargs)
                    if result is not None:
                        run.set_output(result)
                    return result
            return cast(F, arun)

        @functools.wraps(func)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            with AgentRun(spec[0], version=spec[1], scenario=spec[2]) as run:
                result = func(*args, **kwargs)
                if result is not None:
                    run.set_output(result)
                return result
        return cast(F, run_sync)


def agent_run(name: str, *, version: str | None = None, scenario: str | None = None) -> AgentRun:
    """The root span of one agent run, as a context manager or decorator (sync or async).

    Parameters
    ----------
    name:
        The agent's name (``gen_ai.agent.name``): the first part of the stream key.
    version:
        The agent's version (``gen_ai.agent.version``); the monitor falls back to the
        resource's ``service.version``.
    scenario:
        The scenario key (``assaywatch.scenario``); default: the enclosing
        :func:`set_scenario`, else the ``ASSAYWATCH_SCENARIO`` variable.
    """
    return AgentRun(name, version=version, scenario=scenario)


def _tool_span_end(span: Span, result: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> None:
    with guarded("tool.end"):
        span.set_attribute(A.OUTPUT_LENGTH, 0 if result is None else _text_length(result))
        if _capture_content():
            span.set_attribute(A.GEN_AI_TOOL_CALL_ARGUMENTS, json.dumps(
                {"args": list(args), "kwargs": kwargs}, default=str))
            span.set_attribute(A.GEN_AI_TOOL_CALL_RESULT, json.dumps(result, default=str))


def _tool_span(name: str) -> Span:
    try:
        return _get_tracer().start_span(
            f"execute_tool {name}", kind=SpanKind.INTERNAL,
            attributes={A.GEN_AI_OPERATION_NAME: A.OP_EXECUTE_TOOL, A.GEN_AI_TOOL_NAME: name,
                        A.GEN_AI_TOOL_TYPE: "function"})
    except Exception:  # noqa: BLE001
        report("tool.start")
        return trace.INVALID_SPAN


def tool(name: str | Callable[..., Any] | None = None) -> Any:
    """Decorate a tool function (sync or async) so each call is an ``execute_tool`` span.

    Usable bare (``@tool``) or with a name (``@tool("search")``; default: the function's
    ``__name__``). The result's character length (``str(result)``) is always recorded as
    ``assaywatch.output.length``; arguments and result only with the content opt-in.
    """
    if callable(name):
        return tool(None)(name)

    def decorate(func: F) -> F:
        tool_name = str(name or getattr(func, "__name__", "tool"))
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def acall(*args: Any, **kwargs: Any) -> Any:
                span = _tool_span(tool_name)
                token = otel_context.attach(trace.set_span_in_context(span))
                try:
                    result = await func(*args, **kwargs)
                except BaseException as exc:
                    _record_error(span, exc)
                    raise
                else:
                    _tool_span_end(span, result, args, kwargs)
                    return result
                finally:
                    otel_context.detach(token)
                    with guarded("tool.end"):
                        span.end()
            return cast(F, acall)

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            span = _tool_span(tool_name)
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                result = func(*args, **kwargs)
            except BaseException as exc:
                _record_error(span, exc)
                raise
            else:
                _tool_span_end(span, result, args, kwargs)
                return result
            finally:
                otel_context.detach(token)
                with guarded("tool.end"):
                    span.end()
        return cast(F, call)

    return decorate


def _run_span() -> Span | None:
    state = _current_run.get()
    if state is not None and state.span.is_recording():
        return state.span
    span = trace.get_current_span()
    attrs = getattr(span, "attributes", None) or {}
    if span.is_recording() and attrs.get(A.GEN_AI_OPERATION_NAME) == A.OP_INVOKE_AGENT:
        return span
    return None


def record_evaluation(passed: bool | None = None, score: float | None = None,
                      label: str | None = None, *, name: str = "assaywatch",
                      explanation: str | None = None) -> bool:
    """Attach an evaluation (the monitor's oracle) to the current agent run.

    Sets ``assaywatch.evaluation.passed``, ``gen_ai.evaluation.score.value`` and
    ``gen_ai.evaluation.score.label`` (those given) plus ``gen_ai.evaluation.name`` on the
    run's ``invoke_agent`` span, and adds a ``gen_ai.evaluation.result`` span event with the
    same attributes (the GenAI conventions' evaluation event). The monitor reads either.

    Returns
    -------
    bool
        True when attached; False (with a logged warning) when no run is active here, for
        example after a framework's agent call has returned: call it inside ``agent_run``.

    Raises
    ------
    ValueError
        When none of ``passed``, ``score``, ``label`` is given, or ``score`` is not finite.
    """
    if passed is None and score is None and label is None:
        raise ValueError("record_evaluation needs at least one of passed, score, label")
    if score is not None and not math.isfinite(float(score)):
        raise ValueError(f"record_evaluation score must be a finite number, got {score!r}")
    span = _run_span()
    if span is None:
        logger.warning("record_evaluation(%s) outside an active agent run: dropped; call it "
                       "inside `with agent_run(...)`", name)
        return False
    attrs: dict[str, Any] = {A.GEN_AI_EVALUATION_NAME: name}
    if passed is not None:
        attrs[A.EVALUATION_PASSED] = bool(passed)
    if score is not None:
        attrs[A.GEN_AI_EVALUATION_SCORE_VALUE] = float(score)
    if label is not None:
        attrs[A.GEN_AI_EVALUATION_SCORE_LABEL] = label
    if explanation is not None and _capture_content():
        attrs["gen_ai.evaluation.explanation"] = explanation
    with guarded("record_evaluation"):
        span.set_attributes(attrs)
        span.add_event(A.GEN_AI_EVALUATION_RESULT_EVENT, attributes=attrs)
        return True
    return False


def set_scenario(scenario: str) -> None:
    """Set the scenario key: on the current run, and for agent spans started later here.

    Inside ``agent_run`` it applies to that run (and runs nested in it) until the run
    ends; outside any run it applies to the rest of the current context (thread or task),
    including agent spans that framework instrumentations start.
    """
    if not isinstance(scenario, str):
        raise ValueError(f"scenario must be a string, got {type(scenario).__name__}")
    _scenario.set(scenario or None)
    state = _current_run.get()
    if state is not None:
        with guarded("set_scenario"):
            state.span.set_attribute(A.SCENARIO, scenario)
