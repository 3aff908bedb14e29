"""Which instrumentation ``import assaywatch.auto`` activates for a framework, and the
WARNING when a framework is installed that nothing can instrument.

The real genai-openai instrumentation (installed with the dev extra) is activated through
each path; the other candidate names are modules that do not exist, standing in for
packages that are not installed here (the contrib openai-v2 instrumentation cannot be
installed beside genai-openai: they need different util-genai releases)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from assaywatch.instrumentation import frameworks as fw_module
from assaywatch.instrumentation.frameworks import FRAMEWORKS, Framework, FrameworkSet

GENAI_OPENAI = "opentelemetry.instrumentation.genai.openai:OpenAIInstrumentor"
MISSING = "assaywatch_tests_no_such_instrumentation:Instrumentor"


@pytest.fixture
def frameworks() -> Iterator[FrameworkSet]:
    fs = FrameworkSet()
    yield fs
    fs.uninstrument()


def test_the_contrib_openai_v2_instrumentation_is_the_fallback_for_openai() -> None:
    (openai,) = [f for f in FRAMEWORKS if f.name == "openai"]
    assert [d for _, d in openai.candidates()] == [
        "opentelemetry-instrumentation-genai-openai", "opentelemetry-instrumentation-openai-v2"]
    assert openai.candidates()[1][0] == \
        "opentelemetry.instrumentation.openai_v2:OpenAIInstrumentor"


def test_an_alternative_is_activated_when_the_first_is_missing(
        monkeypatch: pytest.MonkeyPatch, frameworks: FrameworkSet) -> None:
    stand_in = Framework("openai", "openai", MISSING,
                         alternatives=((GENAI_OPENAI, "genai-openai"),))
    monkeypatch.setattr(fw_module, "FRAMEWORKS", (stand_in,))
    frameworks.instrument(tracer_provider=TracerProvider(), frameworks=["openai"])
    assert list(frameworks.active) == ["openai"]
    assert type(frameworks.active["openai"]).__module__.startswith(
        "opentelemetry.instrumentation.genai.openai")


def test_installed_framework_without_instrumentation_warns_with_the_package(
        monkeypatch: pytest.MonkeyPatch, frameworks: FrameworkSet,
        caplog: pytest.LogCaptureFixture) -> None:
    stand_in = Framework("openai", "openai", MISSING,
                         alternatives=(("assaywatch_tests_nor_this:X", "some-openai-v2"),))
    monkeypatch.setattr(fw_module, "FRAMEWORKS", (stand_in,))
    with caplog.at_level(logging.WARNING, logger="assaywatch.instrumentation"):
        frameworks.instrument(tracer_provider=TracerProvider(), frameworks=["openai"])
    assert frameworks.active == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "openai is installed" in warnings[0]
    assert "opentelemetry-instrumentation-genai-openai or some-openai-v2" in warnings[0]


def test_a_framework_that_is_not_installed_is_skipped_quietly(
        monkeypatch: pytest.MonkeyPatch, frameworks: FrameworkSet,
        caplog: pytest.LogCaptureFixture) -> None:
    stand_in = Framework("openai", "assaywatch_tests_no_such_library", GENAI_OPENAI)
    monkeypatch.setattr(fw_module, "FRAMEWORKS", (stand_in,))
    with caplog.at_level(logging.DEBUG, logger="assaywatch.instrumentation"):
        frameworks.instrument(tracer_provider=TracerProvider(), frameworks=["openai"])
    assert frameworks.skipped == {"openai": "assaywatch_tests_no_such_library is not installed"}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
