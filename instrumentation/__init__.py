"""Instrument AI agents with OpenTelemetry GenAI spans for ``assaywatch monitor``.

Importing this package has no side effects (``import assaywatch.auto`` acts). Public API:

- :func:`instrument` / :func:`uninstrument`: configure the SDK when the app has not and
  instrument the installed frameworks (OpenAI, Anthropic, LangChain/LangGraph, OpenAI
  Agents SDK) through their maintained OpenTelemetry GenAI instrumentations.
- :func:`agent_run` (context manager and decorator, sync and async): the ``invoke_agent``
  root span of a hand-written agent; :func:`tool`: ``execute_tool`` spans for tools.
- :func:`record_evaluation`: the run's pass/fail or score (the monitor's oracle);
  :func:`set_scenario`: the scenario part of the stream key.

This package depends on the OpenTelemetry API/SDK/exporters only; it never imports the
monitor, the analyzers or numpy.
"""

from __future__ import annotations

from assaywatch.instrumentation._core import (
    instrument,
    instrumented_frameworks,
    is_instrumented,
    uninstrument,
)
from assaywatch.instrumentation._safety import telemetry_errors
from assaywatch.instrumentation.manual import (
    AgentRun,
    agent_run,
    current_scenario,
    record_evaluation,
    set_scenario,
    tool,
)

__all__ = [
    "AgentRun",
    "agent_run",
    "current_scenario",
    "instrument",
    "instrumented_frameworks",
    "is_instrumented",
    "record_evaluation",
    "set_scenario",
    "telemetry_errors",
    "tool",
    "uninstrument",
]
