"""The gate's Markdown summary, for a pull-request comment or ``$GITHUB_STEP_SUMMARY``.

Layout: a headline with the decision and exit code, the reason, the versions compared and
the gate configuration; then one table per stream (test, verdict, key numbers, finding);
then notes on the inputs (files, spans, runs, skipped lines with file:line reasons) and,
for a live gate, the spend against a fixed-n design.

The key numbers are read from :attr:`TestResult.statistics` by name. Recognised names
(first match wins): p-value ``p_value`` / ``p``; Holm-adjusted ``p_value_holm`` /
``p_adjusted`` / ``p_holm`` / ``holm_p`` / ``adjusted_p_value``; ``power``; effect sizes
``difference`` / ``diff``, ``cohens_h``, ``effect`` / ``effect_label``, ``odds_ratio``;
Hotelling ``t2`` and ``d_eff``. Pass rates with their intervals, the top moved features,
coverage and the SPRT path come from the :class:`StreamResult` fields. Other tests show up
to four of their statistics; the JUnit and HTML outputs carry all of them.

Every string from the report is escaped (:func:`md_escape`): Markdown punctuation is
backslash-escaped (so ``a|b`` stays in its table cell and ``<script>`` is text), and line
breaks and control characters become spaces so a name cannot end a table row.

This module also holds the number formatting shared by the JUnit and HTML writers.
"""

from __future__ import annotations

import math
import re
from typing import Any

from assaywatch.monitor.offline.report import GateReport, StreamResult, TestResult

#: Characters that can open Markdown/GFM markup (emphasis, code, links, HTML, tables,
#: strikethrough, entities, GitHub math, headings), escaped with a backslash in report text.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~&$])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
P_ADJUSTED_KEYS = ("p_value_holm", "p_adjusted", "p_holm", "holm_p", "adjusted_p_value")
#: Skipped input lines listed before "... and N more".
MAX_LISTED = 20
VERDICT_WORDS = {"pass": "pass", "fail": "FAIL", "inconclusive": "inconclusive"}
DECISION_WORDS = {"deploy": "DEPLOY", "block": "BLOCK", "manual": "MANUAL REVIEW"}


def md_escape(text: object) -> str:
    """Text safe inside Markdown paragraphs, headings and table cells."""
    flat = _CONTROL.sub(" ", str(text))
    return _MD_SPECIAL.sub(r"\\\1", flat)


def format_value(value: Any) -> str:
    """A statistic as short text: floats to 3 significant digits, None as ``n/a``."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.3g}"
    return str(value)


def format_p(p: Any) -> str:
    """A p-value to 3 significant digits (``3.82e-13``, ``0.0412``)."""
    if isinstance(p, int | float) and not isinstance(p, bool) and math.isfinite(p):
        return f"{p:.3g}"
    return format_value(p)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys: ``{"policy": {"shift": "manual"}}`` -> ``policy.shift``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def first_stat(test: TestResult, *keys: str) -> Any:
    """The first of ``keys`` present in the test's statistics, else None."""
    for key in keys:
        if key in test.statistics:
            return test.statistics[key]
    return None


def stream_verdict(stream: StreamResult) -> str:
    """Suite rule per stream: fail if any test fails, else inconclusive if any is, else pass."""
    verdicts = {t.verdict for t in stream.tests}
    for v in ("fail", "inconclusive"):
        if v in verdicts:
            return v
    return "pass" if stream.tests else "inconclusive"


def _rate(arm: str, values: tuple[float, float, float, int]) -> str:
    p, lo, hi, n = values
    if not n or not math.isfinite(p):
        return f"{arm}: no runs"
    return f"{arm} {p:.3f} [{lo:.3f}, {hi:.3f}] n={n}"


def key_numbers(stream: StreamResult, test: TestResult, top: int = 3) -> list[str]:
    """The few numbers that justify the verdict of ``test``, as short phrases."""
    out: list[str] = []
    if test.name == "pass_rate":
        out += [_rate(a, v) for a, v in stream.pass_rates.items()]
    elif test.name == "coverage" and stream.coverage:
        dims = ", ".join(f"{k} {v:.2f}" for k, v in stream.coverage.items() if k != "overall")
        overall = stream.coverage.get("overall")
        out.append(f"overall {format_value(overall)} ({dims})" if overall is not None
                   else dims)
    elif test.name == "sprt" and stream.sprt_path:
        bounds = (f", bounds [{stream.sprt_bounds[0]:.2f}, {stream.sprt_bounds[1]:.2f}]"
                  if stream.sprt_bounds else "")
        out.append(f"LLR {stream.sprt_path[-1]:.2f} after {len(stream.sprt_path)} runs{bounds}")
    p = first_stat(test, "p_value", "p")
    if p is not None:
        out.append(f"{'Hotelling ' if test.name == 'fingerprint' else ''}p={format_p(p)}")
    p_adj = first_stat(test, *P_ADJUSTED_KEYS)
    if p_adj is not None:
        out.append(f"Holm p={format_p(p_adj)}")
    for label, keys in (("power", ("power",)), ("diff", ("difference", "diff"))):
        v = first_stat(test, *keys)
        if isinstance(v, int | float):
            out.append(f"{label} {v:.3f}")
    h, size = first_stat(test, "cohens_h"), first_stat(test, "effect", "effect_label")
    if h is not None:
        out.append(f"h {format_value(h)}" + (f" ({size})" if size is not None else ""))
    for label, keys in (("OR", ("odds_ratio",)), ("T2", ("t2",)), ("d_eff", ("d_eff",))):
        v = first_stat(test, *keys)
        if v is not None:
            out.append(f"{label} {format_value(v)}")
    if test.name == "fingerprint" and stream.feature_shifts:
        moved = sorted(stream.feature_shifts, key=lambda r: -abs(r[1]))[:top]
        out.append("moved: " + ", ".join(f"{n} {s:+.2f}" for n, s in moved))
    if not out:
        out += [f"{k} {format_value(v)}" for k, v in list(test.statistics.items())[:4]]
    return out


def _table(stream: StreamResult) -> list[str]:
    lines = ["| Test | Verdict | Key numbers | Finding |", "|---|---|---|---|"]
    for t in stream.tests:
        word = VERDICT_WORDS.get(t.verdict, t.verdict)
        verdict = f"**{md_escape(word)}**" if t.verdict == "fail" else md_escape(word)
        nums = "; ".join(md_escape(x) for x in key_numbers(stream, t))
        lines.append(f"| {md_escape(t.name)} | {verdict} | {nums} | {md_escape(t.message)} |")
    if not stream.tests:
        lines.append("| (none) | inconclusive | no tests ran | |")
    return lines


def _listing(key: str, value: Any) -> list[str]:
    if isinstance(value, dict):
        inner = ", ".join(f"{md_escape(k)} {md_escape(format_value(v))}" for k, v in
                          value.items())
        return [f"- {md_escape(key)}: {inner}"]
    if isinstance(value, list | tuple):
        if not value:
            return [f"- {md_escape(key)}: none"]
        head = [f"- {md_escape(key)} ({len(value)}):"]
        head += [f"  - {md_escape(format_value(v))}" for v in value[:MAX_LISTED]]
        if len(value) > MAX_LISTED:
            head.append(f"  - ... and {len(value) - MAX_LISTED} more")
        return head
    return [f"- {md_escape(key)}: {md_escape(format_value(value))}"]


def markdown_summary(report: GateReport) -> str:
    """The whole summary as GitHub-flavoured Markdown (tables), ending with a newline."""
    word = DECISION_WORDS.get(report.decision, report.decision.upper())
    lines = [f"## assaywatch gate: {md_escape(word)} (exit {report.exit_code})", "",
             f"**Decision: {md_escape(report.decision)}.** {md_escape(report.reason)}", ""]
    counts = {v: sum(stream_verdict(s) == v for s in report.streams)
              for v in ("pass", "fail", "inconclusive")}
    versions = sorted({(s.version, s.baseline_version) for s in report.streams})
    compared = "; ".join(f"candidate {md_escape(c)} vs baseline {md_escape(b)}"
                         for c, b in versions)
    lines.append(f"{len(report.streams)} streams: {counts['pass']} pass, {counts['fail']} "
                 f"fail, {counts['inconclusive']} inconclusive"
                 + (f" ({compared})" if compared else "") + ".")
    if report.config:
        cfg = ", ".join(f"{md_escape(k)}={md_escape(format_value(v))}"
                        for k, v in flatten(report.config).items())
        lines += ["", f"Gate config: {cfg}"]
    for st in report.streams:
        lines += ["", f"### {md_escape(st.name)}: {md_escape(stream_verdict(st))}", "",
                  f"Candidate {md_escape(st.version)} vs baseline "
                  f"{md_escape(st.baseline_version)}", "", *_table(st)]
    if report.inputs:
        lines += ["", "### Inputs", ""]
        for k, v in report.inputs.items():
            lines += _listing(k, v)
    if report.spend:
        lines += ["", "### Spend", ""]
        for k, v in report.spend.items():
            lines += _listing(k, v)
    return "\n".join(lines) + "\n"
