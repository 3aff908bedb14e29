"""HTML report: self-contained, escaped, plots drawn to the data, renders in Chromium.

Each plot is an inline ``<svg>`` that is well-formed XML by construction, so the tests cut
the SVGs out and parse them with ElementTree, then check geometry against the report's
numbers (positions must be an affine map of the values; bars sorted and coloured by the
threshold). The screenshot test renders the page in headless Chromium, decodes the PNG
with zlib and checks the decision banner and plot colours are actually painted.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from assaywatch.monitor.offline import svg
from assaywatch.monitor.offline.html_report import DECISION_COLOURS, html_report, write_html
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

PX = 0.11  # coordinates are written with one decimal: 0.05 px rounding per end


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _tags(html: str) -> _Tags:
    parser = _Tags()
    parser.feed(html)
    return parser


def _svgs(html: str, kind: str) -> list[ET.Element]:
    found = re.findall(rf'<svg class="plot plot-{kind}".*?</svg>', html, flags=re.S)
    return [ET.fromstring(s) for s in found]


def _affine_ok(values: list[float], coords: list[float]) -> bool:
    """coords = a + b * values for some a, b (fitted on the extremes), within rounding."""
    b = np.polyfit(values, coords, 1)
    return bool(np.all(np.abs(np.polyval(b, values) - np.asarray(coords)) < 2 * PX))


@pytest.mark.parametrize("name", sorted(ALL))
def test_page_is_self_contained(name: str) -> None:
    html = html_report(ALL[name]())
    tags = _tags(html)
    assert html.startswith("<!DOCTYPE html>")
    assert not [t for t, _ in tags.tags if t in ("script", "link", "img", "iframe", "object")]
    assert not [a for _, a in tags.tags if "src" in a]
    assert all((a.get("href") or "").startswith("#") for t, a in tags.tags if "href" in a)
    assert "url(" not in html and "@import" not in html and "http" not in html


def test_every_stream_has_its_plots_with_stable_ids() -> None:
    report = sprt_report()
    html = html_report(report)
    tags = _tags(html).tags
    ids = [a["id"] for _, a in tags if a.get("id")]
    assert len(ids) == len(set(ids))
    for kind in ("pass-rate", "feature-shift", "coverage"):
        assert len(_svgs(html, kind)) == len(report.streams)
        for i in range(len(report.streams)):
            assert f"plot-{kind}-{i}" in ids
    # the SPRT path only where a SPRT ran
    assert [bool(s.sprt_path) for s in report.streams] == [True, False]
    assert len(_svgs(html, "sprt")) == 1 and "plot-sprt-0" in ids
    assert not _svgs(html_report(block_report()), "sprt")


def test_pass_rate_plot_places_points_and_bars_by_the_data() -> None:
    report = block_report()
    stream = report.streams[0]
    (plot,) = _svgs(html_report(report), "pass-rate")[:1]
    values, coords = [], []
    for arm in ("baseline", "candidate"):
        g = next(g for g in plot.iter("g") if g.get("class") == f"arm arm-{arm}")
        p, lo, hi, n = stream.pass_rates[arm]
        bar = g.find("line")
        circle = g.find("circle")
        assert bar is not None and circle is not None
        values += [p, lo, hi]
        coords += [float(circle.get("cy", "nan")), float(bar.get("y1", "nan")),
                   float(bar.get("y2", "nan"))]
        assert any(f"n={n}" in (t.text or "") for t in g.iter("text"))
    assert _affine_ok(values, coords)
    assert coords[0] < coords[3]  # higher pass rate is drawn higher (smaller y)


def test_feature_shift_bars_sorted_coloured_and_proportional() -> None:
    report = manual_report()
    stream = report.streams[0]
    threshold = report.config["fingerprint_shift"]
    (plot,) = _svgs(html_report(report), "feature-shift")[:1]
    bars = [g for g in plot.iter("g") if g.get("class") == "bar"]
    expected = sorted(stream.feature_shifts, key=lambda r: -abs(r[1]))[:15]
    titles = [(g.findtext("title") or "").rsplit(": ", 1)[0] for g in bars]
    assert titles == [n for n, _ in expected]
    widths = []
    for g, (_, shift) in zip(bars, expected, strict=True):
        rect = g.find("rect")
        assert rect is not None
        assert (rect.get("fill") == svg.ALERT) == (abs(shift) >= threshold)
        widths.append(float(rect.get("width", "nan")))
    # bars under 1 px are widened to 1 px so a zero shift stays visible: compare the rest
    big = [(abs(s), w) for (_, s), w in zip(expected, widths, strict=True) if w > 1.5]
    assert len(big) >= 3
    assert _affine_ok([a for a, _ in big], [w for _, w in big])
    assert np.polyfit(*zip(*big, strict=True), 1)[1] == pytest.approx(0.0, abs=0.2)
    guides = [ln for ln in plot.iter("line") if ln.get("stroke-dasharray")]
    xs = sorted(float(ln.get("x1", "nan")) for ln in guides)
    centre = next(float(ln.get("x1", "nan")) for ln in plot.iter("line")
                  if ln.get("stroke") == "#57606a")
    assert len(xs) == 2 and abs((xs[0] + xs[1]) / 2 - centre) < PX  # symmetric +-threshold


def test_coverage_bars_scale_zero_to_one() -> None:
    report = manual_report()
    stream = report.streams[1]
    (plot,) = _svgs(html_report(report), "coverage")[1:2]
    bars = [g for g in plot.iter("g") if g.get("class") == "bar"]
    names = [(g.findtext("title") or "").split(":")[0] for g in bars]
    assert names[-1] == "overall" and set(names) == set(stream.coverage)
    values = [stream.coverage[n] for n in names]
    widths = [float(r.get("width", "nan")) for g in bars if (r := g.find("rect")) is not None]
    assert len(widths) == len(bars)
    assert _affine_ok(values, widths)
    assert np.polyfit(values, widths, 1)[1] == pytest.approx(0.0, abs=0.5)  # bars start at 0


def test_sprt_plot_draws_every_run_and_both_boundaries() -> None:
    report = sprt_report()
    stream = report.streams[0]
    assert stream.sprt_bounds is not None and len(stream.sprt_path) < svg.MAX_PATH_POINTS
    (plot,) = _svgs(html_report(report), "sprt")
    line = next(plot.iter("polyline"))
    pts = [tuple(map(float, p.split(","))) for p in (line.get("points") or "").split()]
    assert len(pts) == len(stream.sprt_path) + 1  # the origin, then one point per run
    llr = [0.0, *stream.sprt_path]
    assert _affine_ok(list(range(len(llr))), [x for x, _ in pts])
    ys = [y for _, y in pts]
    assert _affine_ok(llr, ys)
    b = np.polyfit(llr, ys, 1)
    bounds = [float(ln.get("y1", "nan")) for ln in plot.iter("line")
              if ln.get("stroke-dasharray")]
    assert sorted(bounds) == pytest.approx(sorted(np.polyval(b, stream.sprt_bounds)), abs=2 * PX)


def test_long_sprt_paths_are_thinned_but_keep_the_last_run() -> None:
    path = list(np.cumsum(np.random.default_rng(3).normal(size=5000)) / 20)
    plot = ET.fromstring(svg.sprt_plot(path, (-2.25, 2.89)))
    pts = (next(plot.iter("polyline")).get("points") or "").split()
    assert len(pts) <= svg.MAX_PATH_POINTS + 2
    circle = next(plot.iter("circle"))
    assert pts[-1] == f"{circle.get('cx')},{circle.get('cy')}"


@pytest.mark.parametrize("make", [deploy_report, block_report, manual_report])
def test_headline_colour_and_reason(make: Callable[[], GateReport]) -> None:
    report = make()
    tags = _tags(html_report(report))
    banner = next(a for t, a in tags.tags if "decision" in (a.get("class") or "").split())
    assert DECISION_COLOURS[report.decision] in (banner.get("style") or "")
    assert report.reason in tags.text


def test_table_lists_every_test_with_its_statistics() -> None:
    report = sprt_report()
    text = "".join(_tags(html_report(report)).text)
    for stream in report.streams:
        for test in stream.tests:
            assert test.message in text
            for key in test.statistics:
                assert f"{key} = " in text


def test_every_report_string_is_escaped() -> None:
    report = hostile_report()
    html = html_report(report)
    tags = _tags(html)
    assert not [t for t, _ in tags.tags if t in ("script", "img", "b", "i")]
    text = "".join(tags.text)
    assert report.streams[0].agent in text  # shown as text, intact
    assert "tool:<img src=x onerror=alert(1)>" in text
    for s in re.findall(r"<svg .*?</svg>", html, flags=re.S):
        ET.fromstring(s)  # the plots stay well-formed with hostile labels


def test_write_html(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    write_html(deploy_report(), out)
    assert out.read_text(encoding="utf-8") == html_report(deploy_report())


def test_degenerate_values_draw_without_nan_coordinates() -> None:
    html = html_report(degenerate_report())
    plots = re.findall(r"<svg .*?</svg>", html, flags=re.S)
    assert len(plots) == 3  # pass rate, feature shift, SPRT (no coverage data)
    for s in plots:
        for el in ET.fromstring(s).iter():
            for attr in ("x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "width", "points"):
                assert "nan" not in (el.get(attr) or "").lower(), (el.tag, attr)
    shift = _svgs(html, "feature-shift")[0]
    values = [t.text for t in shift.iter("text")]
    assert "+inf" in values and "-0.20" in values  # the NaN shift is left out
    assert "no runs" in [t.text for t in _svgs(html, "pass-rate")[0].iter("text")]
    empty = html_report(GateReport("manual", 2, "no candidate runs and no baselines"))
    assert "No streams were evaluated." in empty and "<svg" not in empty


# ---------------------------------------------------------------- headless Chromium

def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser",
                                               "google-chrome")) if p), None)


def _run_chromium(binary: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp / 'profile'}", "--window-size=1280,2000",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def decode_png(data: bytes) -> np.ndarray:
    """8-bit non-interlaced RGB(A)/grey PNG -> (height, width, channels) uint8 array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    assert ihdr is not None
    w, h, depth, colour, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0 and colour in (0, 2, 4, 6)
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, w * bpp + 1)
    out = np.zeros((h, w * bpp), np.uint8)
    prev = np.zeros(w * bpp, np.uint8)
    for y in range(h):
        f, line = int(raw[y, 0]), raw[y, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 1:  # Sub: a running sum per channel, mod 256
            cur = (np.cumsum(line.reshape(w, bpp), axis=0, dtype=np.int64) % 256)
            cur = cur.astype(np.uint8).reshape(-1)
        elif f == 2:  # Up
            cur = line + prev
        else:  # Average / Paeth depend on the pixel to the left: a plain loop
            lb, pb, rec = line.tobytes(), prev.tobytes(), bytearray(w * bpp)
            for i in range(w * bpp):
                a = rec[i - bpp] if i >= bpp else 0
                if f == 3:
                    rec[i] = (lb[i] + ((a + pb[i]) >> 1)) & 255
                    continue
                b, c = pb[i], (pb[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pbb, pc = abs(p - a), abs(p - b), abs(p - c)
                rec[i] = (lb[i] + (a if pa <= pbb and pa <= pc else b if pbb <= pc else c)) & 255
            cur = np.frombuffer(bytes(rec), np.uint8)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)


def _has_colour(img: np.ndarray, hex_colour: str, tol: int = 10) -> bool:
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    return bool(np.any(np.all(np.abs(img[..., :3].astype(int) - rgb) <= tol, axis=-1)))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[GateReport, Path, str]:
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install -y chromium)")
    tmp = tmp_path_factory.mktemp("chromium")
    report = sprt_report()
    page = tmp / "report.html"
    write_html(report, page)
    png = tmp / "shot.png"
    _run_chromium(binary, tmp, f"--screenshot={png}", page.as_uri())
    dom = _run_chromium(binary, tmp, "--dump-dom", page.as_uri()).stdout
    return report, png, dom


@pytest.mark.slow
def test_screenshot_shows_banner_and_plots(rendered: tuple[GateReport, Path, str]) -> None:
    report, png, _ = rendered
    data = png.read_bytes()
    assert len(data) > 20_000  # a blank 1280x2000 page compresses to a few kB
    img = decode_png(data)
    assert img.shape[:2] == (2000, 1280)
    packed = img[..., :3].astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1], np.uint32)
    assert len(np.unique(packed)) > 50  # not a single colour (text antialiasing gives 1000s)
    # the decision banner is painted near the top, in the decision's colour
    assert _has_colour(img[:200], DECISION_COLOURS[report.decision], tol=4)
    # the plots are painted: the arms' marker colours and the alert/ok guide colours
    for colour in (svg.BASELINE, svg.CANDIDATE, svg.OK):
        assert _has_colour(img, colour), colour


@pytest.mark.slow
def test_rendered_dom_contains_the_svg_plots(rendered: tuple[GateReport, Path, str]) -> None:
    report, _, dom = rendered
    tags = _tags(dom).tags
    classes = [(a.get("class") or "").split() for t, a in tags if t == "svg"]
    for kind in ("pass-rate", "feature-shift", "coverage"):
        assert sum(f"plot-{kind}" in c for c in classes) == len(report.streams)
    assert sum("plot-sprt" in c for c in classes) == 1
    n_rects = sum(1 for t, _ in tags if t == "rect")
    assert n_rects > 2 * len(report.streams)
    assert sum(1 for t, _ in tags if t == "polyline") == 1
