"""The gate's HTML report: one self-contained file that opens offline in any browser.

No scripts, fonts, stylesheets or images are fetched: the CSS is inline and the plots are
inline SVG drawn by :mod:`assaywatch.monitor.offline.svg`. Every string taken from the
report (agent and scenario names, messages, file names from skipped lines) goes through
:func:`html.escape`, because those strings come from span attributes anyone can set.

Page
----
1. Headline: the decision in its colour (deploy green, block red, manual review amber),
   the exit code and the reason; versions compared, gate configuration.
2. Overview table: one row per stream with its verdict per test.
3. Per stream (``<section class="stream">``): the plots, each an ``<svg>`` with a stable
   class and id —

   - ``plot-pass-rate`` (``id="plot-pass-rate-<i>"``): pass rates with 95% intervals;
   - ``plot-feature-shift``: standardised shift per fingerprint feature, +-threshold;
   - ``plot-coverage``: coverage per dimension, with C_min;
   - ``plot-sprt``: the SPRT path with its boundaries, only when a SPRT ran;

   then a table of every test with its verdict, finding and all its statistics.
4. Inputs (files, spans, runs, skipped lines) and, for a live gate, the spend.

The shift threshold is ``shift_threshold`` if given, else the config's
``shift_threshold`` or ``fingerprint_shift``, else 0.5 baseline standard deviations (the
monitor's default per-feature shift).
"""

from __future__ import annotations

import os
from html import escape
from typing import Any

from assaywatch.monitor.offline import svg
from assaywatch.monitor.offline.markdown import (
    DECISION_WORDS,
    MAX_LISTED,
    flatten,
    format_value,
    key_numbers,
    stream_verdict,
)
from assaywatch.monitor.offline.report import GateReport, StreamResult

DEFAULT_SHIFT_THRESHOLD = 0.5
DECISION_COLOURS = {"deploy": "#1a7f37", "block": "#cf222e", "manual": "#9a6700"}

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #24292f; background: #f6f8fa; }
main { max-width: 1180px; margin: 0 auto; padding: 16px 24px 48px; }
.decision { color: #fff; padding: 18px 24px; border-radius: 8px; margin: 16px 0; }
.decision h1 { margin: 0 0 6px; font-size: 28px; }
.decision p { margin: 0; font-size: 16px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 8px;
          padding: 12px 20px 16px; margin: 16px 0; }
h2 { font-size: 20px; margin: 6px 0 10px; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
figure { margin: 0; } figcaption { font-size: 12px; color: #57606a; margin-top: 2px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; width: 100%; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left;
         vertical-align: top; }
th { background: #f6f8fa; }
.verdict { font-weight: 600; padding: 1px 8px; border-radius: 10px; white-space: nowrap; }
.v-pass { background: #dafbe1; color: #1a7f37; }
.v-fail { background: #ffebe9; color: #cf222e; }
.v-inconclusive { background: #fff8c5; color: #9a6700; }
.stats { font-family: ui-monospace, monospace; font-size: 12px; color: #424a53; }
.meta { color: #57606a; font-size: 13px; }
"""


def _v(verdict: str) -> str:
    cls = verdict if verdict in ("pass", "fail", "inconclusive") else "inconclusive"
    return f'<span class="verdict v-{cls}">{escape(verdict)}</span>'


def _threshold(report: GateReport, shift_threshold: float | None) -> float:
    if shift_threshold is not None:
        return shift_threshold
    for key in ("shift_threshold", "fingerprint_shift"):
        value = report.config.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    return DEFAULT_SHIFT_THRESHOLD


def _num(config: dict[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _figure(plot: str, caption: str) -> str:
    return f"<figure>{plot}<figcaption>{escape(caption)}</figcaption></figure>"


def _stream_section(i: int, st: StreamResult, report: GateReport, threshold: float) -> str:
    theta = _num(report.config, "theta")
    c_min = _num(report.config, "c_min", "C_min", "coverage_min")
    figs = []
    if st.pass_rates:
        figs.append(_figure(svg.pass_rate_plot(st.pass_rates, theta, f"plot-pass-rate-{i}"),
                            "Pass rate, 95% Wilson intervals"))
    if st.feature_shifts:
        figs.append(_figure(svg.feature_shift_plot(st.feature_shifts, threshold,
                                                   id_=f"plot-feature-shift-{i}"),
                            f"Fingerprint shift, guide at \u00b1{threshold:g} SD"))
    if st.coverage:
        figs.append(_figure(svg.coverage_plot(st.coverage, c_min, f"plot-coverage-{i}"),
                            "Coverage per dimension"))
    if st.sprt_path:
        figs.append(_figure(svg.sprt_plot(st.sprt_path, st.sprt_bounds, f"plot-sprt-{i}"),
                            "SPRT log-likelihood ratio per run"))
    rows = []
    for t in st.tests:
        nums = "; ".join(escape(x) for x in key_numbers(st, t))
        stats = "<br>".join(f"{escape(k)} = {escape(format_value(v))}"
                            for k, v in t.statistics.items())
        rows.append(f"<tr><td>{escape(t.name)}</td><td>{_v(t.verdict)}</td>"
                    f"<td>{escape(t.message)}<div class=\"meta\">{nums}</div></td>"
                    f'<td class="stats">{stats}</td></tr>')
    return (f'<section class="stream" id="stream-{i}"><h2>{escape(st.name)} '
            f"{_v(stream_verdict(st))}</h2>"
            f'<p class="meta">candidate {escape(st.version)} vs baseline '
            f"{escape(st.baseline_version)}</p>"
            f'<div class="plots">{"".join(figs)}</div>'
            "<table><thead><tr><th>Test</th><th>Verdict</th><th>Finding</th>"
            f"<th>Statistics</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
            "</section>")


def _overview(report: GateReport) -> str:
    names: list[str] = []
    for st in report.streams:
        names += [t.name for t in st.tests if t.name not in names]
    head = "".join(f"<th>{escape(n)}</th>" for n in names)
    rows = []
    for i, st in enumerate(report.streams):
        by_name = {t.name: t.verdict for t in st.tests}
        cells = "".join(f"<td>{_v(by_name[n]) if n in by_name else ''}</td>" for n in names)
        rows.append(f'<tr><td><a href="#stream-{i}">{escape(st.name)}</a></td>'
                    f"<td>{_v(stream_verdict(st))}</td>{cells}</tr>")
    return (f"<table class=\"overview\"><thead><tr><th>Stream</th><th>Verdict</th>{head}"
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _listing(title: str, data: dict[str, Any]) -> str:
    items = []
    for key, value in data.items():
        if isinstance(value, list | tuple):
            shown = "".join(f"<li>{escape(format_value(v))}</li>" for v in value[:MAX_LISTED])
            more = (f"<li>... and {len(value) - MAX_LISTED} more</li>"
                    if len(value) > MAX_LISTED else "")
            inner = f"<ul>{shown}{more}</ul>" if value else " none"
            items.append(f"<li>{escape(key)} ({len(value)}):{inner}</li>")
        elif isinstance(value, dict):
            inner = ", ".join(f"{escape(str(k))} {escape(format_value(v))}"
                              for k, v in flatten(value).items())
            items.append(f"<li>{escape(key)}: {inner}</li>")
        else:
            items.append(f"<li>{escape(key)}: {escape(format_value(value))}</li>")
    return f'<section class="{escape(title.lower())}"><h2>{escape(title)}</h2>' \
           f"<ul>{''.join(items)}</ul></section>"


def html_report(report: GateReport, shift_threshold: float | None = None) -> str:
    """The whole report as one HTML5 document (UTF-8, no external resources)."""
    colour = DECISION_COLOURS.get(report.decision, "#57606a")
    word = DECISION_WORDS.get(report.decision, report.decision.upper())
    threshold = _threshold(report, shift_threshold)
    versions = sorted({(s.version, s.baseline_version) for s in report.streams})
    compared = "; ".join(f"candidate {escape(c)} vs baseline {escape(b)}" for c, b in versions)
    config = ", ".join(f"{escape(k)}={escape(format_value(v))}"
                       for k, v in flatten(report.config).items())
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>assaywatch gate: {escape(word)}</title><style>{_CSS}</style></head><body>",
        "<main>",
        f'<div class="decision decision-{escape(report.decision)}" style="background:{colour}">'
        f"<h1>assaywatch gate: {escape(word)} (exit {report.exit_code})</h1>"
        f"<p>{escape(report.reason)}</p></div>",
        f'<p class="meta">{len(report.streams)} streams'
        + (f"; {compared}" if compared else "") + "</p>",
        f'<p class="meta">Gate config: {config}</p>' if config else "",
        _overview(report) if report.streams else "<p>No streams were evaluated.</p>",
        *(_stream_section(i, st, report, threshold) for i, st in enumerate(report.streams)),
        _listing("Inputs", report.inputs) if report.inputs else "",
        _listing("Spend", report.spend) if report.spend else "",
        "</main></body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def write_html(
    report: GateReport, path: str | os.PathLike[str], shift_threshold: float | None = None
) -> None:
    """Write :func:`html_report` to ``path`` (UTF-8); the parent folder must exist."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(html_report(report, shift_threshold))
