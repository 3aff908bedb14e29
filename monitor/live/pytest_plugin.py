"""The assaywatch pytest plugin: ``@assaywatch.stochastic`` tests in pytest's summary.

Registered through the ``pytest11`` entry point (``assaywatch``) and inert unless a test
uses the decorator: loading it imports nothing beyond this module and
``assaywatch.monitor.live.stochastic`` (no OpenTelemetry SDK, no statistics).

Options
-------
``--assaywatch-inconclusive {skip,xfail,fail}``
    What an Inconclusive stochastic test becomes when its decorator does not say
    (default ``skip``).
``--assaywatch-spans FILE``
    Record each trial as one agent run and append the spans to FILE (OTLP JSON Lines,
    readable by ``assaywatch baseline build`` and ``assaywatch gate --candidate``). A tracer
    provider is installed for the session only if the process has none; otherwise our span
    processor is added to the existing one.
"""

from __future__ import annotations

from typing import Any

from assaywatch.monitor.live import stochastic as _st


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("assaywatch", "assaywatch stochastic tests")
    group.addoption("--assaywatch-inconclusive", choices=_st.INCONCLUSIVE_MODES,
                    default="skip", help="what an Inconclusive @assaywatch.stochastic test "
                    "becomes when its decorator does not say (default skip)")
    group.addoption("--assaywatch-spans", metavar="FILE", default=None,
                    help="append the stochastic trials' spans to FILE (OTLP JSON Lines)")


class _SpanRecorder:
    """In-memory capture of the trials' spans, flushed to the file after each test."""

    def __init__(self, path: str) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        self.path = path
        self.exporter = InMemorySpanExporter()
        processor = SimpleSpanProcessor(self.exporter)
        provider = trace.get_tracer_provider()
        if not hasattr(provider, "add_span_processor"):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
            provider = trace.get_tracer_provider()
        provider.add_span_processor(processor)  # type: ignore[attr-defined]

    def flush(self) -> None:
        spans = list(self.exporter.get_finished_spans())
        self.exporter.clear()
        if spans:
            from assaywatch.monitor.receivers.files.otlp_json import write_otlp_json_lines

            write_otlp_json_lines(self.path, spans)


_recorder: _SpanRecorder | None = None


def pytest_configure(config: Any) -> None:
    _st.SETTINGS["inconclusive"] = config.getoption("assaywatch_inconclusive")
    _st.SETTINGS["spans"] = config.getoption("assaywatch_spans")


def pytest_runtest_setup(item: Any) -> None:
    global _recorder
    func = getattr(item, "function", None)
    if not getattr(func, "_assaywatch_stochastic", False):
        return
    _st.SETTINGS["current"] = item.nodeid
    path = _st.SETTINGS.get("spans")
    if path and _recorder is None:
        _recorder = _SpanRecorder(path)


def pytest_runtest_teardown(item: Any) -> None:
    if _recorder is not None:
        _recorder.flush()
    _st.SETTINGS["current"] = None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _st.RESULTS:
        return
    terminalreporter.section("assaywatch stochastic tests")
    for res in _st.RESULTS:
        terminalreporter.write_line(res.line())
