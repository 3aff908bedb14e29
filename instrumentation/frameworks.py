"""Framework instrumentation: activate the maintained OpenTelemetry GenAI instrumentations.

For each supported framework a maintained instrumentation exists in
``open-telemetry/opentelemetry-python-genai`` (``opentelemetry-instrumentation-genai-*``,
built on ``opentelemetry-util-genai``; shared/reference/otel-conventions.md 5.1):

=================  ==================  ================================================
framework          library probed      instrumentation activated (``...`` =
                                       ``opentelemetry.instrumentation.genai``)
=================  ==================  ================================================
``openai``         ``openai``          ``...openai:OpenAIInstrumentor``, else the
                                       contrib ``opentelemetry.instrumentation.openai_v2``
                                       (``opentelemetry-instrumentation-openai-v2``)
``anthropic``      ``anthropic``       ``...anthropic:AnthropicInstrumentor``
``langchain``      ``langchain_core``  ``...langchain:LangChainInstrumentor``
``openai_agents``  ``agents``          ``...openai_agents:OpenAIAgentsInstrumentor``
=================  ==================  ================================================

The first instrumentation of a framework's list that is installed is activated. A
framework that is installed while none of its instrumentations is gets a WARNING naming
the package to install: its calls would otherwise reach the monitor as runs without
their model steps, and nothing else would say so.

They already emit ``invoke_agent`` / ``chat`` / ``execute_tool`` spans with agent and tool
names, token usage and ``error.type``, and capture no content unless
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` opts in, so writing our own would
only duplicate them. We add what the monitor needs and they lack:

- **output lengths** (``assaywatch.output.length``) without content. util-genai hands the
  messages to a *completion hook* in-process whatever the capture mode, and puts them on
  spans only when content capture is on; :class:`LengthHook` measures them there (chaining
  to any hook the user configured with ``OTEL_INSTRUMENTATION_GENAI_COMPLETION_HOOK``).
  Tool spans get no hook call, so ``ToolInvocation._apply_finish`` is wrapped to measure
  the result the instrumentation recorded.
- **handoffs** of the OpenAI Agents SDK, which its instrumentation ignores:
  :mod:`assaywatch.instrumentation.agents_handoff`.
- **the scenario key**: :class:`ScenarioProcessor` stamps ``assaywatch.scenario`` on
  agent spans started where :func:`~assaywatch.instrumentation.set_scenario` is in force.

None of these packages is a dependency of assaywatch: a framework is instrumented only
when both it and its instrumentation are installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import Span

from assaywatch.instrumentation import attributes as A
from assaywatch.instrumentation._safety import guarded, logger
from assaywatch.instrumentation.manual import current_scenario


@dataclass(frozen=True)
class Framework:
    """A supported framework: the library to probe and the instrumentor to activate.

    ``alternatives`` are other maintained instrumentations of the same library, as
    ``(module:Class, distribution)`` pairs, tried in order when ``instrumentor`` is not
    installed.
    """

    name: str
    library: str
    instrumentor: str
    skip_dep_check: bool = False
    alternatives: tuple[tuple[str, str], ...] = ()

    @property
    def distribution(self) -> str:
        """The PyPI distribution of :attr:`instrumentor`."""
        return "opentelemetry-instrumentation-genai-" + self.name.replace("_", "-")

    def candidates(self) -> tuple[tuple[str, str], ...]:
        return ((self.instrumentor, self.distribution), *self.alternatives)


FRAMEWORKS: tuple[Framework, ...] = (
    Framework("openai", "openai",
              "opentelemetry.instrumentation.genai.openai:OpenAIInstrumentor",
              alternatives=(("opentelemetry.instrumentation.openai_v2:OpenAIInstrumentor",
                             "opentelemetry-instrumentation-openai-v2"),)),
    Framework("anthropic", "anthropic",
              "opentelemetry.instrumentation.genai.anthropic:AnthropicInstrumentor"),
    # The instrumentation declares ``langchain`` but patches only langchain_core (and
    # langgraph.pregel when present): LangGraph apps often install langchain-core alone.
    Framework("langchain", "langchain_core",
              "opentelemetry.instrumentation.genai.langchain:LangChainInstrumentor",
              skip_dep_check=True),
    Framework("openai_agents", "agents",
              "opentelemetry.instrumentation.genai.openai_agents:OpenAIAgentsInstrumentor"),
)


def _text_of(part: Any) -> int:
    content = getattr(part, "content", None)
    if isinstance(content, str):
        return len(content)
    arguments = getattr(part, "arguments", None)
    if arguments is not None:
        return len(arguments) if isinstance(arguments, str) else len(str(arguments))
    return 0


def output_length(outputs: list[Any]) -> int:
    """Characters in util-genai output messages: text parts plus tool-call arguments."""
    return sum(_text_of(p) for m in outputs for p in (getattr(m, "parts", None) or []))


class LengthHook:
    """A util-genai completion hook recording output lengths, never content.

    Parameters
    ----------
    chained:
        A user hook (e.g. the ``upload`` hook) called afterwards, or None.
    """

    def __init__(self, chained: Any | None = None) -> None:
        self.chained = chained

    def on_completion(self, *, inputs: list[Any], outputs: list[Any],
                      system_instruction: list[Any], tool_definitions: list[Any] | None = None,
                      span: Span | None = None, log_record: Any | None = None) -> None:
        with guarded("length_hook"):
            if span is not None and span.is_recording() and outputs:
                span.set_attribute(A.OUTPUT_LENGTH, output_length(outputs))
        if self.chained is not None:
            self.chained.on_completion(inputs=inputs, outputs=outputs,
                                       system_instruction=system_instruction,
                                       tool_definitions=tool_definitions, span=span,
                                       log_record=log_record)


def _chained_user_hook() -> Any | None:
    if not os.environ.get("OTEL_INSTRUMENTATION_GENAI_COMPLETION_HOOK"):
        return None
    from opentelemetry.util.genai.completion_hook import load_completion_hook

    return load_completion_hook()


class ScenarioProcessor(SpanProcessor):
    """Span processor stamping the scenario key on agent spans that start without one.

    Added to an SDK provider; when instrumentation is removed it is switched off (the
    SDK has no way to remove a processor), after which it does nothing.
    """

    def __init__(self) -> None:
        self.enabled = True

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        if not self.enabled:
            return
        with guarded("scenario_processor"):
            attrs = span.attributes or {}
            if attrs.get(A.GEN_AI_OPERATION_NAME) == A.OP_INVOKE_AGENT and A.SCENARIO not in attrs:
                scenario = current_scenario()
                if scenario:
                    span.set_attribute(A.SCENARIO, scenario)



def _tool_finish_wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
    with guarded("tool_length"):
        result = getattr(instance, "tool_result", None)
        if result is not None and instance.span.is_recording():
            text = result if isinstance(result, str) else str(result)
            instance.span.set_attribute(A.OUTPUT_LENGTH, len(text))
    return wrapped(*args, **kwargs)


_TOOL_MODULE = "opentelemetry.util.genai._tool_invocation"


def _wrap_tool_invocation() -> bool:
    try:
        from wrapt import wrap_function_wrapper

        module = importlib.import_module(_TOOL_MODULE)
        wrap_function_wrapper(module, "ToolInvocation._apply_finish", _tool_finish_wrapper)
        return True
    except (ImportError, AttributeError):
        logger.debug("util-genai ToolInvocation not found; tool spans get no output length")
        return False


def _unwrap_tool_invocation() -> None:
    with guarded("unwrap_tool"):
        from opentelemetry.instrumentation.utils import unwrap

        module = importlib.import_module(_TOOL_MODULE)
        unwrap(module.ToolInvocation, "_apply_finish")


#: Start of the skip reason of an installed framework that nothing can instrument.
_NOT_INSTRUMENTED = "no instrumentation of it is installed"


def _disabled_names() -> set[str]:
    raw = os.environ.get(A.ENV_DISABLED_INSTRUMENTATIONS, "")
    return {n.strip() for n in raw.split(",") if n.strip()}


class FrameworkSet:
    """The framework instrumentations we activated, so we can undo exactly those."""

    def __init__(self) -> None:
        self.active: dict[str, Any] = {}
        self.skipped: dict[str, str] = {}
        self._tool_wrapped = False
        self._handoff: Any | None = None

    def instrument(self, *, tracer_provider: Any | None,
                   frameworks: list[str] | None = None,
                   disable_openai_trace_export: bool = False) -> None:
        """Activate every installed framework instrumentation (or those named)."""
        disabled = _disabled_names()
        hook = LengthHook(_chained_user_hook())
        wanted = {f.name for f in FRAMEWORKS} if frameworks is None else set(frameworks)
        unknown = wanted - {f.name for f in FRAMEWORKS}
        if unknown:
            raise ValueError(f"unknown frameworks {sorted(unknown)}; known: "
                             f"{[f.name for f in FRAMEWORKS]}")
        for fw in FRAMEWORKS:
            if fw.name not in wanted or fw.name in self.active:
                continue
            reason = self._activate(fw, disabled, tracer_provider, hook,
                                    disable_openai_trace_export)
            if reason:
                self.skipped[fw.name] = reason
                if reason.startswith(_NOT_INSTRUMENTED):
                    logger.warning("%s is installed but %s: its calls will not be traced, "
                                   "and runs reach the monitor without their %s steps",
                                   fw.library, reason, fw.name)
                else:
                    logger.debug("not instrumenting %s: %s", fw.name, reason)
        if self.active and not self._tool_wrapped:
            self._tool_wrapped = _wrap_tool_invocation()

    def _activate(self, fw: Framework, disabled: set[str], tracer_provider: Any | None,
                  hook: LengthHook, disable_openai_trace_export: bool) -> str | None:
        if fw.name in disabled or "*" in disabled:
            return f"listed in {A.ENV_DISABLED_INSTRUMENTATIONS}"
        if importlib.util.find_spec(fw.library) is None:
            return f"{fw.library} is not installed"
        cls = None
        for target, _dist in fw.candidates():
            module_name, _, cls_name = target.partition(":")
            try:
                cls = getattr(importlib.import_module(module_name), cls_name)
                break
            except ImportError:
                continue
            except Exception:  # installed but broken (a version conflict): say so, go on
                logger.warning("%s is installed but cannot be imported; trying the next "
                               "instrumentation of %s", module_name, fw.library,
                               exc_info=True)
        if cls is None:
            names = " or ".join(d for _, d in fw.candidates())
            return f"{_NOT_INSTRUMENTED} (pip install {names})"
        instrumentor = cls()
        if instrumentor.is_instrumented_by_opentelemetry:
            # Someone else (the app, opentelemetry-instrument) owns it: keep theirs as is.
            return "already instrumented by someone else"
        kwargs: dict[str, Any] = {"completion_hook": hook}
        if tracer_provider is not None:
            kwargs["tracer_provider"] = tracer_provider
        if fw.skip_dep_check:
            kwargs["skip_dep_check"] = True
        if fw.name == "openai_agents" and disable_openai_trace_export:
            kwargs["disable_openai_trace_export"] = True
        with guarded(f"instrument.{fw.name}"):
            instrumentor.instrument(**kwargs)
        if not instrumentor.is_instrumented_by_opentelemetry:
            return "its instrumentation refused (version conflict; see the log)"
        self.active[fw.name] = instrumentor
        if fw.name == "openai_agents":
            with guarded("instrument.agents_handoff"):
                from assaywatch.instrumentation import agents_handoff

                self._handoff = agents_handoff.install(tracer_provider)
        return None

    def uninstrument(self) -> None:
        """Undo what :meth:`instrument` did, and nothing else."""
        if self._handoff is not None:
            with guarded("uninstrument.agents_handoff"):
                from assaywatch.instrumentation import agents_handoff

                agents_handoff.remove(self._handoff)
            self._handoff = None
        for name, instrumentor in list(self.active.items()):
            with guarded(f"uninstrument.{name}"):
                instrumentor.uninstrument()
            del self.active[name]
        self.skipped.clear()
        if self._tool_wrapped:
            _unwrap_tool_invocation()
            self._tool_wrapped = False
