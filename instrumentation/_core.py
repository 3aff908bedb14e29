"""``instrument()`` / ``uninstrument()``: the one switch behind ``assaywatch.auto``.

Idempotent and thread-safe: a second ``instrument()`` while instrumented is a no-op that
returns False; ``uninstrument()`` undoes the framework patches and our span processor,
and leaves alone everything the application configured. A tracer provider that we
installed stays installed (the OpenTelemetry API cannot unset the global provider).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from assaywatch.instrumentation import manual
from assaywatch.instrumentation._safety import logger

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from assaywatch.instrumentation.frameworks import FrameworkSet, ScenarioProcessor

_lock = threading.RLock()
_frameworks: FrameworkSet | None = None
_processors: dict[int, tuple[Any, ScenarioProcessor]] = {}
_instrumented = False


def is_instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return _instrumented


def instrumented_frameworks() -> dict[str, str]:
    """Framework name -> ``"active"`` or the reason it was skipped."""
    if _frameworks is None:
        return {}
    status = {name: "active" for name in _frameworks.active}
    status.update(_frameworks.skipped)
    return status


def _add_scenario_processor(provider: Any) -> None:
    from assaywatch.instrumentation.frameworks import ScenarioProcessor

    existing = _processors.get(id(provider))
    if existing is not None and existing[0] is provider:
        existing[1].enabled = True
        return
    if not hasattr(provider, "add_span_processor"):
        logger.debug("tracer provider %r takes no span processors; scenario keys apply to "
                     "agent_run spans only", type(provider).__name__)
        return
    processor = ScenarioProcessor()
    provider.add_span_processor(processor)
    _processors[id(provider)] = (provider, processor)


def instrument(*, tracer_provider: trace.TracerProvider | None = None,
               configure_sdk: bool = True, service_name: str | None = None,
               exporter: SpanExporter | None = None, protocol: str | None = None,
               endpoint: str | None = None, headers: Mapping[str, str] | None = None,
               frameworks: Sequence[str] | None = None,
               disable_openai_trace_export: bool = False) -> bool:
    """Configure the SDK if the app has not, and instrument every supported framework.

    Parameters
    ----------
    tracer_provider:
        Emit into this provider instead of the global one (no SDK configuration then).
    configure_sdk:
        Install an SDK provider exporting OTLP when none is set (default True). An
        existing provider is always kept, exporters and all.
    service_name, exporter, protocol, endpoint, headers:
        Passed to :func:`assaywatch.instrumentation.setup.configure_sdk`; they override
        the ``OTEL_*`` variables and matter only when we configure the SDK.
    frameworks:
        Names to instrument (``openai``, ``anthropic``, ``langchain``, ``openai_agents``);
        default all that are installed.
    disable_openai_trace_export:
        Remove the OpenAI Agents SDK's own exporter to OpenAI's hosted tracing while
        instrumented, so its traces flow only through OpenTelemetry.

    Returns
    -------
    bool
        True when this call instrumented; False when already instrumented or
        ``OTEL_SDK_DISABLED=true``.
    """
    global _frameworks, _instrumented
    from assaywatch.instrumentation import setup

    with _lock:
        if _instrumented:
            return False
        if setup.sdk_disabled():
            logger.debug("OTEL_SDK_DISABLED=true: not instrumenting")
            return False
        if tracer_provider is None and configure_sdk:
            setup.configure_sdk(service_name=service_name, exporter=exporter,
                                protocol=protocol, endpoint=endpoint, headers=headers)
        _add_scenario_processor(tracer_provider or trace.get_tracer_provider())
        manual.set_tracer_provider(tracer_provider)
        from assaywatch.instrumentation.frameworks import FrameworkSet

        _frameworks = _frameworks or FrameworkSet()
        _frameworks.instrument(tracer_provider=tracer_provider,
                               frameworks=list(frameworks) if frameworks is not None else None,
                               disable_openai_trace_export=disable_openai_trace_export)
        _instrumented = True
        return True


def uninstrument() -> None:
    """Undo :func:`instrument`: framework patches removed, our span processor switched off."""
    global _instrumented
    with _lock:
        if _frameworks is not None:
            _frameworks.uninstrument()
        for _provider, processor in _processors.values():
            processor.enabled = False
        manual.set_tracer_provider(None)
        _instrumented = False
