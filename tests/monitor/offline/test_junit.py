"""JUnit XML of the gate: schema-valid, one suite per stream, outcomes and statistics."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
import xmlschema

from assaywatch.monitor.offline.junit import GATE_SUITE, junit_xml, write_junit
from assaywatch.monitor.offline.report import GateReport
from tests.monitor.offline.sample_report import (
    ALL,
    block_report,
    degenerate_report,
    deploy_report,
    hostile_report,
    manual_report,
    sprt_report,
)

XSD = Path(__file__).with_name("junit.xsd")
REPORTS = {**ALL, "hostile": hostile_report, "degenerate": degenerate_report,
           "empty": lambda: GateReport("manual", 2, "no candidate runs and no baselines")}


@pytest.fixture(scope="module")
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(XSD))


@pytest.fixture(scope="module")
def strict_schema(tmp_path_factory: pytest.TempPathFactory) -> xmlschema.XMLSchema:
    """junit-10 as published: the testcase-properties extension line removed."""
    lines = [ln for ln in XSD.read_text().splitlines() if "<!-- EXTENSION -->" not in ln]
    assert len(lines) == len(XSD.read_text().splitlines()) - 1
    path = tmp_path_factory.mktemp("xsd") / "junit-strict.xsd"
    path.write_text("\n".join(lines))
    return xmlschema.XMLSchema(str(path))


def _suites(report: GateReport) -> list[ET.Element]:
    return ET.fromstring(junit_xml(report).encode()).findall("testsuite")


def _props(el: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in el.findall("properties/property")}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_output_validates_against_junit_schema(name: str, schema: xmlschema.XMLSchema) -> None:
    schema.validate(junit_xml(REPORTS[name]()))


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_strict_mode_validates_against_unextended_junit10(
    name: str, strict_schema: xmlschema.XMLSchema
) -> None:
    report = REPORTS[name]()
    strict_schema.validate(junit_xml(report, testcase_properties=False))
    # the strict schema is really stricter: the default output uses testcase properties
    if any(t.statistics for s in report.streams for t in s.tests):
        assert not strict_schema.is_valid(junit_xml(report))


def test_one_suite_per_stream_and_one_case_per_test() -> None:
    report = block_report()
    suites = _suites(report)
    assert suites[0].get("name") == GATE_SUITE
    assert [s.get("name") for s in suites[1:]] == [f"{s.agent}/{s.scenario}"
                                                   for s in report.streams]
    for suite, stream in zip(suites[1:], report.streams, strict=True):
        cases = suite.findall("testcase")
        assert [c.get("name") for c in cases] == [t.name for t in stream.tests]
        assert {c.get("classname") for c in cases} == {
            f"assaywatch.{stream.agent}.{stream.scenario}"}
        # the counts CI systems display agree with the children
        assert suite.get("tests") == str(len(cases))
        assert suite.get("failures") == str(len(suite.findall("testcase/failure")))
        assert suite.get("skipped") == str(len(suite.findall("testcase/skipped")))
        assert suite.get("errors") == "0"


def test_totals_on_testsuites_match_cases() -> None:
    root = ET.fromstring(junit_xml(manual_report()).encode())
    assert root.get("tests") == str(len(root.findall("testsuite/testcase")))
    assert root.get("failures") == str(len(root.findall("testsuite/testcase/failure")))


def test_fail_becomes_failure_with_evidence() -> None:
    report = block_report()
    stream = next(s for s in report.streams if s.scenario == "refund")
    test = next(t for t in stream.tests if t.name == "pass_rate")
    assert test.verdict == "fail"
    suite = next(s for s in _suites(report) if s.get("name") == stream.name)
    case = next(c for c in suite.findall("testcase") if c.get("name") == "pass_rate")
    failure = case.find("failure")
    assert failure is not None and case.find("skipped") is None
    assert failure.get("message") == test.message
    assert failure.get("type") == "assaywatch.pass_rate"
    text = failure.text or ""
    p, lo, hi, n = stream.pass_rates["candidate"]
    assert f"candidate {p:.3f} [{lo:.3f}, {hi:.3f}] n={n}" in text  # the interval evidence
    assert f"p_value = {test.statistics['p_value']!r}" in text
    # passing tests carry no outcome element
    passing = [c for c in suite.findall("testcase") if c.get("name") == "coverage"]
    assert passing and passing[0].find("failure") is None and passing[0].find("skipped") is None


def test_inconclusive_becomes_skipped() -> None:
    report = manual_report()
    stream = next(s for s in report.streams if s.scenario == "billing")
    test = next(t for t in stream.tests if t.name == "pass_rate")
    assert test.verdict == "inconclusive"  # 15 candidate runs cannot have the power
    suite = next(s for s in _suites(report) if s.get("name") == stream.name)
    case = next(c for c in suite.findall("testcase") if c.get("name") == "pass_rate")
    skipped = case.find("skipped")
    assert skipped is not None and case.find("failure") is None
    assert skipped.get("message") == test.message
    assert "power = " in (skipped.text or "")


def test_statistics_round_trip_as_testcase_properties() -> None:
    report = sprt_report()
    for suite, stream in zip(_suites(report)[1:], report.streams, strict=True):
        for case, test in zip(suite.findall("testcase"), stream.tests, strict=True):
            props = _props(case)
            assert set(props) == set(test.statistics)
            for key, value in test.statistics.items():
                if isinstance(value, float):
                    assert float(props[key]) == value or (math.isnan(value)
                                                          and props[key] == "nan")
                elif value is None:
                    assert props[key] == "null"
                else:
                    assert props[key] == str(value)


def test_strict_mode_moves_statistics_to_the_suite() -> None:
    report = block_report()
    root = ET.fromstring(junit_xml(report, testcase_properties=False).encode())
    suite = root.findall("testsuite")[1]
    props = _props(suite)
    stats = report.streams[0].tests[0].statistics
    assert float(props["pass_rate.p_value"]) == stats["p_value"]
    assert not root.findall("testsuite/testcase/properties")


def test_stream_properties_carry_rates_coverage_shifts_and_sprt() -> None:
    report = sprt_report()
    stream = report.streams[0]
    props = _props(_suites(report)[1])
    p, lo, hi, n = stream.pass_rates["baseline"]
    assert (float(props["pass_rate.baseline"]), float(props["pass_rate.baseline.lower"]),
            float(props["pass_rate.baseline.upper"]), int(props["pass_rate.baseline.n"])) == (
        p, lo, hi, n)
    assert float(props["coverage.overall"]) == stream.coverage["overall"]
    name, shift = stream.feature_shifts[0]
    assert float(props[f"shift.{name}"]) == shift
    assert int(props["sprt.runs"]) == len(stream.sprt_path)
    assert stream.sprt_bounds is not None
    assert float(props["sprt.upper"]) == stream.sprt_bounds[1]
    assert props["stream.baseline_version"] == stream.baseline_version


@pytest.mark.parametrize(("make", "outcome"), [(deploy_report, None), (block_report, "failure"),
                                               (manual_report, "skipped")])
def test_gate_suite_holds_decision_config_and_inputs(
    make: Callable[[], GateReport], outcome: str | None
) -> None:
    report = make()
    gate = _suites(report)[0]
    props = _props(gate)
    assert props["gate.decision"] == report.decision
    assert props["gate.exit_code"] == str(report.exit_code)
    assert props["gate.reason"] == report.reason
    assert float(props["config.alpha"]) == report.config["alpha"]
    assert props["config.policy.behaviour_shift"] == "manual"  # nested config flattened
    assert int(props["inputs.runs.candidate"]) == report.inputs["runs"]["candidate"]
    (case,) = gate.findall("testcase")
    assert case.get("name") == "decision"
    children = [c.tag for c in case if c.tag in ("failure", "skipped")]
    assert children == ([outcome] if outcome else [])


def test_hostile_strings_are_escaped_and_control_characters_replaced() -> None:
    report = hostile_report()
    text = junit_xml(report)
    assert "\x01" not in text and "\x0b" not in text
    suites = ET.fromstring(text.encode()).findall("testsuite")  # parses: well-formed
    stream = report.streams[0]
    assert suites[1].get("name") == stream.name.replace("\x01", "\ufffd")
    case = suites[1].find("testcase")
    assert case is not None
    assert case.get("classname") == (f"assaywatch.{stream.agent}.{stream.scenario}"
                                     .replace("\x01", "\ufffd"))
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("message") == stream.tests[0].message.replace("\x0b", "\ufffd")
    assert "<script>" not in text  # markup in names is character data, not elements


def test_write_junit_writes_the_same_document(tmp_path: Path) -> None:
    report = deploy_report()
    out = tmp_path / "gate.xml"
    write_junit(report, out)
    assert out.read_text(encoding="utf-8") == junit_xml(report)
    assert out.read_text(encoding="utf-8").startswith('<?xml version="1.0" encoding="UTF-8"?>')
