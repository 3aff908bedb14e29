"""JUnit XML for the gate, in the Ant/Jenkins format CI systems render.

Shape
-----
::

    <testsuites name="assaywatch gate" tests= failures= errors="0">
      <testsuite name="assaywatch gate" ...>         gate-level: decision, config, inputs
        <properties> gate.decision, gate.exit_code, gate.reason, config.*, inputs.*, spend.*
        <testcase classname="assaywatch.gate" name="decision">  fails on block,
                                                                 skipped on manual review
      <testsuite name="<agent>/<scenario>" ...>      one per stream
        <properties> stream.agent, stream.version, ..., pass_rate.candidate.lower, ...
        <testcase classname="assaywatch.<agent>.<scenario>" name="<test name>">
          <properties> every statistic of the test
          <failure message=... type="assaywatch.<test>">evidence</failure>   verdict fail
          <skipped message=...>evidence</skipped>                           inconclusive

Choices
-------
- **Inconclusive is ``<skipped>``.** JUnit has no "not enough evidence" outcome. A
  failure would block pipelines on data that shows no regression; a pass would hide that
  the design lacked power. Jenkins, GitLab and GitHub test reporters show skipped tests
  apart from passes ("needs attention"), which is what an Inconclusive verdict asks for.
- **The gate decision is a testcase too** (suite ``assaywatch gate``): the decision of
  SPEC.md also depends on coverage and policy, so a manual review can come with no failed
  statistical test; the extra testcase makes the decision visible in every CI view.
  The ``testsuites`` element of the Jenkins schema takes no properties, so gate-level
  properties live on this first testsuite.
- **Statistics as testcase properties.** The strict junit-10.xsd has ``<properties>`` only
  on ``<testsuite>``; testcase-level properties are the widespread extension read by the
  Jenkins JUnit plugin, GitLab, pytest (``record_property``) and most report viewers.
  ``testcase_properties=False`` instead puts them on the stream's testsuite as
  ``<test>.<statistic>``, which validates against the strict schema.
- Property values: floats in ``repr`` (round-trip exact), None as ``null``, lists and
  dicts as JSON. Characters XML 1.0 forbids (control characters from a malformed span
  file) are replaced by U+FFFD so the file always parses.
"""

from __future__ import annotations

import json
import math
import os
import re
import xml.etree.ElementTree as ET
from typing import Any

from assaywatch.monitor.offline.markdown import flatten, key_numbers
from assaywatch.monitor.offline.report import GateReport, StreamResult, TestResult

GATE_SUITE = "assaywatch gate"
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_text(value: object) -> str:
    """``str(value)`` with characters XML 1.0 cannot hold replaced by U+FFFD."""
    return _XML_ILLEGAL.sub("\ufffd", str(value))


def property_value(value: Any) -> str:
    """A statistic as a property value (exact floats, ``null``, JSON for containers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value)
                                                         else "inf" if value > 0 else "-inf")
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def _properties(parent: ET.Element, props: dict[str, Any]) -> None:
    if not props:
        return
    el = ET.SubElement(parent, "properties")
    for name, value in props.items():
        ET.SubElement(el, "property", name=xml_text(name), value=xml_text(property_value(value)))


def _evidence(stream: StreamResult | None, test: TestResult) -> str:
    lines = [test.message] if test.message else []
    if stream is not None:
        lines += key_numbers(stream, test)
    lines += [f"{k} = {property_value(v)}" for k, v in test.statistics.items()]
    return xml_text("\n".join(lines))


def _outcome(case: ET.Element, verdict: str, message: str, kind: str, evidence: str) -> None:
    if verdict == "fail":
        el = ET.SubElement(case, "failure", message=xml_text(message), type=kind)
        el.text = evidence
    elif verdict != "pass":  # inconclusive, or an unknown verdict: never a silent pass
        el = ET.SubElement(case, "skipped", message=xml_text(message or verdict))
        el.text = evidence


def _stream_properties(stream: StreamResult) -> dict[str, Any]:
    props: dict[str, Any] = {
        "stream.agent": stream.agent, "stream.version": stream.version,
        "stream.scenario": stream.scenario, "stream.baseline_version": stream.baseline_version,
    }
    for arm, (p, lo, hi, n) in stream.pass_rates.items():
        props.update({f"pass_rate.{arm}": p, f"pass_rate.{arm}.lower": lo,
                      f"pass_rate.{arm}.upper": hi, f"pass_rate.{arm}.n": n})
    props.update({f"coverage.{k}": v for k, v in stream.coverage.items()})
    props.update({f"shift.{name}": s for name, s in stream.feature_shifts})
    if stream.sprt_path:
        props["sprt.runs"] = len(stream.sprt_path)
        props["sprt.llr"] = stream.sprt_path[-1]
    if stream.sprt_bounds is not None:
        props["sprt.lower"], props["sprt.upper"] = stream.sprt_bounds
    return props


def _suite(root: ET.Element, name: str, cases: int, failures: int, skipped: int) -> ET.Element:
    return ET.SubElement(root, "testsuite", name=xml_text(name), tests=str(cases),
                         failures=str(failures), errors="0", skipped=str(skipped), time="0")


def _classname(stream: StreamResult) -> str:
    return xml_text(f"assaywatch.{stream.agent}.{stream.scenario or '-'}")


def build_junit(report: GateReport, testcase_properties: bool = True) -> ET.Element:
    """The ``<testsuites>`` element (see the module docstring for the layout)."""
    root = ET.Element("testsuites", name=GATE_SUITE)
    gate_fail = int(report.decision == "block")
    gate_skip = int(report.decision not in ("deploy", "block"))
    gate = _suite(root, GATE_SUITE, 1, gate_fail, gate_skip)
    _properties(gate, {"gate.decision": report.decision, "gate.exit_code": report.exit_code,
                       "gate.reason": report.reason, "gate.streams": len(report.streams),
                       **flatten(report.config, "config."), **flatten(report.inputs, "inputs."),
                       **flatten(report.spend, "spend.")})
    case = ET.SubElement(gate, "testcase", classname="assaywatch.gate", name="decision",
                         time="0")
    verdict = {"deploy": "pass", "block": "fail"}.get(report.decision, "inconclusive")
    summary = TestResult("decision", verdict, {"decision": report.decision,
                                               "exit_code": report.exit_code}, report.reason)
    _outcome(case, verdict, f"{report.decision}: {report.reason}", "assaywatch.gate",
             _evidence(None, summary))
    total, failed, skipped = 1, gate_fail, gate_skip
    for stream in report.streams:
        fails = sum(t.verdict == "fail" for t in stream.tests)
        skips = sum(t.verdict not in ("pass", "fail") for t in stream.tests)
        suite = _suite(root, stream.name, len(stream.tests), fails, skips)
        props = _stream_properties(stream)
        if not testcase_properties:
            for t in stream.tests:
                props.update({f"{t.name}.{k}": v for k, v in t.statistics.items()})
        _properties(suite, props)
        for t in stream.tests:
            case = ET.SubElement(suite, "testcase", classname=_classname(stream),
                                 name=xml_text(t.name), time="0")
            if testcase_properties:
                _properties(case, t.statistics)
            _outcome(case, t.verdict, t.message or f"{t.name}: {t.verdict}",
                     f"assaywatch.{xml_text(t.name)}", _evidence(stream, t))
        total, failed, skipped = total + len(stream.tests), failed + fails, skipped + skips
    root.set("tests", str(total))
    root.set("failures", str(failed))
    root.set("errors", "0")
    root.set("time", "0")
    return root


def junit_xml(report: GateReport, testcase_properties: bool = True) -> str:
    """The JUnit XML document as a string, with an XML declaration, indented."""
    root = build_junit(report, testcase_properties)
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + body + "\n"


def write_junit(
    report: GateReport, path: str | os.PathLike[str], testcase_properties: bool = True
) -> None:
    """Write :func:`junit_xml` to ``path`` (UTF-8); the parent folder must exist."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(junit_xml(report, testcase_properties))
