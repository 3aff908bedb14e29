"""Markdown summary: headline, one table per stream, key numbers, escaping, input notes.

Tables are checked the way GitHub reads them: the summary is parsed with markdown-it-py
(the CommonMark parser rich uses) with its GFM table rule on, and cells are compared after
parsing, so an unescaped pipe or a name that ends a row shows up as a wrong cell count.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from assaywatch.monitor.offline.markdown import markdown_summary, md_escape
from assaywatch.monitor.offline.report import GateReport
from tests.monitor.offline.sample_report import (
    block_report,
    degenerate_report,
    deploy_report,
    hostile_report,
    manual_report,
    sprt_report,
)

MD = MarkdownIt("commonmark").enable("table")


def _tables(text: str) -> list[list[list[str]]]:
    """Every table as rows of cell texts (inline content after Markdown parsing)."""
    tables: list[list[list[str]]] = []
    row: list[str] = []
    tokens: list[Token] = MD.parse(text)
    for i, tok in enumerate(tokens):
        if tok.type == "table_open":
            tables.append([])
        elif tok.type == "tr_open":
            row = []
        elif tok.type in ("th_open", "td_open"):
            inline = tokens[i + 1]
            row.append("".join(c.content for c in inline.children or []
                               if c.type in ("text", "code_inline")))
        elif tok.type == "tr_close":
            tables[-1].append(row)
    return tables


def _text_of(inline: Token) -> str:
    return "".join(c.content for c in inline.children or [] if c.type == "text")


def _headings(text: str, level: str) -> list[str]:
    tokens = MD.parse(text)
    return [_text_of(tokens[i + 1]) for i, t in enumerate(tokens)
            if t.type == "heading_open" and t.tag == level]


def _paragraphs(text: str) -> list[str]:
    """Paragraph texts after parsing (escapes resolved, emphasis markers dropped)."""
    tokens = MD.parse(text)
    return [_text_of(tokens[i + 1]) for i, t in enumerate(tokens) if t.type == "paragraph_open"]


@pytest.mark.parametrize(("make", "word"), [(deploy_report, "DEPLOY"), (block_report, "BLOCK"),
                                            (manual_report, "MANUAL REVIEW")])
def test_headline_states_decision_exit_code_and_reason(
    make: Callable[[], GateReport], word: str
) -> None:
    report = make()
    text = markdown_summary(report)
    (title,) = _headings(text, "h2")[:1]
    assert word in title and f"exit {report.exit_code}" in title
    assert _paragraphs(text)[0] == f"Decision: {report.decision}. {report.reason}"


def test_one_table_per_stream_with_a_row_per_test() -> None:
    report = sprt_report()
    text = markdown_summary(report)
    tables = _tables(text)
    assert len(tables) == len(report.streams)
    for table, stream in zip(tables, report.streams, strict=True):
        assert table[0] == ["Test", "Verdict", "Key numbers", "Finding"]
        assert [r[0] for r in table[1:]] == [t.name for t in stream.tests]
        assert [r[1].lower() for r in table[1:]] == [t.verdict for t in stream.tests]
        assert all(len(r) == 4 for r in table)
    assert _headings(text, "h3")[:2] == [f"{s.name}: fail" if any(
        t.verdict == "fail" for t in s.tests) else f"{s.name}: inconclusive"
        for s in report.streams]


def test_key_numbers_show_rates_with_intervals_p_values_power_and_effect() -> None:
    report = block_report()
    stream = report.streams[0]
    row = _tables(markdown_summary(report))[0][1]
    stats = stream.tests[0].statistics
    for arm in ("baseline", "candidate"):
        p, lo, hi, n = stream.pass_rates[arm]
        assert f"{arm} {p:.3f} [{lo:.3f}, {hi:.3f}] n={n}" in row[2]
    assert f"p={stats['p_value']:.3g}" in row[2]
    assert f"Holm p={stats['p_value_holm']:.3g}" in row[2]
    assert f"power {stats['power']:.3f}" in row[2]
    assert f"({stats['effect']})" in row[2] and "h " in row[2]
    assert row[3] == stream.tests[0].message


def test_fingerprint_row_names_the_features_that_moved_most() -> None:
    report = manual_report()
    stream = report.streams[0]  # the tool-mix shift
    row = next(r for r in _tables(markdown_summary(report))[0] if r[0] == "fingerprint")
    assert row[1] == "FAIL"
    top = sorted(stream.feature_shifts, key=lambda r: -abs(r[1]))[:3]
    moved = row[2].split("moved: ")[1]
    assert [part.rsplit(" ", 1)[0] for part in moved.split(", ")] == [n for n, _ in top]
    assert {n for n, _ in top[:2]} == {"tool:search", "tool:lookup"}  # the simulated shift
    fp = next(t for t in stream.tests if t.name == "fingerprint")
    assert f"Hotelling p={fp.statistics['p_value']:.3g}" in row[2]


def test_coverage_row_shows_overall_and_dimensions() -> None:
    report = manual_report()
    stream = report.streams[1]
    row = next(r for r in _tables(markdown_summary(report))[1] if r[0] == "coverage")
    assert row[2].startswith(f"overall {stream.coverage['overall']:.3g} (")
    for dim in ("tool", "path", "state", "boundary", "model"):
        assert f"{dim} {stream.coverage[dim]:.2f}" in row[2]


def test_pipes_in_names_stay_inside_their_cell() -> None:
    report = block_report()
    text = markdown_summary(report)
    assert "support-bot/search|web" in _headings(text, "h3")[2]
    hostile = hostile_report()
    tables = _tables(markdown_summary(hostile))
    assert all(len(r) == 4 for t in tables for r in t)
    row = tables[0][1]
    # control characters became spaces; pipes, quotes and markup are literal text
    assert row[3] == hostile.streams[0].tests[0].message.replace("\x0b", " ").strip()


def test_markup_in_names_is_not_rendered_as_html() -> None:
    html = MD.render(markdown_summary(hostile_report()))
    for tag in ("<script", "<img", "<b>", "<i>"):
        assert tag not in html
    assert "&lt;script&gt;" in html  # shown as text


def test_inputs_list_skipped_lines_and_truncate_long_lists() -> None:
    report = block_report()
    text = markdown_summary(report)
    assert "### Inputs" in text
    for line in report.inputs["skipped"]:
        assert md_escape(line) in text
    report.inputs["skipped"] = [f"spans.jsonl:{i}: not JSON" for i in range(1, 26)]
    text = markdown_summary(report)
    assert "spans.jsonl:20: not JSON" in text and "spans.jsonl:21:" not in text
    assert "and 5 more" in text


def test_spend_section_only_for_a_live_gate() -> None:
    assert "### Spend" in markdown_summary(sprt_report())
    assert "### Spend" not in markdown_summary(deploy_report())


def test_degenerate_and_empty_reports() -> None:
    text = markdown_summary(degenerate_report())
    (table,) = _tables(text)
    assert "candidate: no runs" in table[1][2]
    assert "nan [" not in text
    text = markdown_summary(GateReport("manual", 2, "no candidate runs and no baselines"))
    assert _tables(text) == [] and "0 streams" in text
