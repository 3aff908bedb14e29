"""Small inline-SVG charts for the gate's HTML report (no plotting library, no scripts).

Each function returns one ``<svg>`` element as a string with the classes ``plot`` and
``plot-<kind>`` (and an optional id), a ``<title>`` for screen readers and tooltips, and
every label passed through :func:`html.escape`, so the markup is safe to inline in HTML
built from untrusted span data. The charts use only lines, rectangles, circles and text,
which every browser renders the same offline.

Charts
------
- :func:`pass_rate_plot`: baseline vs candidate pass rate with their 95% Wilson intervals
  as error bars, and the gate's theta as a dashed guide.
- :func:`feature_shift_plot`: standardised fingerprint shift per feature,
  (m_c - m_b) / sd_pooled, as horizontal bars, largest |shift| first, with a dashed
  +-threshold guide. Infinite shifts (a feature constant in both samples at different
  values) are drawn to the axis end and labelled ``inf``.
- :func:`coverage_plot`: coverage per dimension on a fixed 0..1 scale with C_min.
- :func:`sprt_plot`: Wald's log-likelihood ratio after each run with the two boundaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

BASELINE = "#4a6fa5"
CANDIDATE = "#d9822b"
ALERT = "#cf222e"
OK = "#1a7f37"
MUTED = "#8c959f"
GRID = "#d0d7de"
#: At most this many points are drawn on an SPRT path (the last point is always kept).
MAX_PATH_POINTS = 1500


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") if abs(x) >= 10 else f"{x:.3g}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n 'nice' ticks (steps of 1, 2 or 5 times a power of ten) covering [lo, hi]."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 5.0, 10.0) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    out, t = [], first
    while t <= hi + 1e-9 * step:
        out.append(round(t, 12))
        t += step
    return out


def _open(kind: str, width: int, height: int, title: str, id_: str | None) -> list[str]:
    ident = f' id="{escape(id_)}"' if id_ else ""
    return [f'<svg class="plot plot-{kind}"{ident} width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
            f"<title>{escape(title)}</title>",
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>']


def _text(x: float, y: float, s: str, anchor: str = "start", size: int = 11,
          fill: str = "#24292f", weight: str = "normal", rotate: float = 0.0) -> str:
    turn = f' transform="rotate({rotate:g} {x:.1f} {y:.1f})"' if rotate else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{fill}" font-weight="{weight}" font-family="sans-serif"{turn}>'
            f"{escape(s)}</text>")


def _line(x1: float, y1: float, x2: float, y2: float, stroke: str = GRID, width: float = 1,
          dash: str | None = None) -> str:
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{stroke}" stroke-width="{width}"{d}/>')


def pass_rate_plot(
    pass_rates: dict[str, tuple[float, float, float, int]],
    theta: float | None = None,
    id_: str | None = None,
) -> str:
    """Point and error bar per arm: ``{"baseline": (p, lo, hi, n), "candidate": ...}``.

    The y axis starts at the lowest interval bound (or theta) rounded down to 0.1, not at
    0: pass rates near 0.9 differing by 0.05 would be invisible on a 0..1 axis. The axis
    labels make the truncation explicit.
    """
    w, h, left, right, top, bottom = 360, 240, 48, 16, 24, 40
    arms: list[str] = [a for a in ("baseline", "candidate") if a in pass_rates]
    arms += [a for a in pass_rates if a not in arms]
    drawn = [a for a in arms if pass_rates[a][3] > 0 and all(map(math.isfinite,
                                                                   pass_rates[a][:3]))]
    lows = [pass_rates[a][1] for a in drawn] + ([theta] if theta is not None else [])
    y_lo = max(0.0, math.floor(min(lows, default=0.0) * 10 - 1e-9) / 10)
    y_lo = min(y_lo, 0.9)
    y_hi = 1.0

    def y(v: float) -> float:
        return top + (y_hi - min(max(v, y_lo), y_hi)) / (y_hi - y_lo) * (h - top - bottom)

    out = _open("pass-rate", w, h, "Pass rate with 95% confidence intervals", id_)
    for t in _ticks(y_lo, y_hi):
        out += [_line(left, y(t), w - right, y(t)), _text(left - 6, y(t) + 4, _fmt(t), "end")]
    out.append(_text(12, top + (h - top - bottom) / 2, "pass rate", "middle", 11, MUTED,
                     rotate=-90))
    if theta is not None:
        out += [_line(left, y(theta), w - right, y(theta), ALERT, 1, "5 4"),
                _text(w - right - 2, y(theta) - 4, f"theta {_fmt(theta)}", "end", 10, ALERT)]
    slot = (w - left - right) / max(len(arms), 1)
    for i, arm in enumerate(arms):
        p, lo, hi, n = pass_rates[arm]
        cx = left + slot * (i + 0.5)
        color = BASELINE if arm == "baseline" else CANDIDATE
        if arm not in drawn:
            out += [_text(cx, h - bottom + 16, arm, "middle"),
                    _text(cx, top + 40, "no runs", "middle", 11, MUTED)]
            continue
        out += [f'<g class="arm arm-{escape(arm)}">',
                _line(cx, y(lo), cx, y(hi), color, 2),
                _line(cx - 8, y(lo), cx + 8, y(lo), color, 2),
                _line(cx - 8, y(hi), cx + 8, y(hi), color, 2),
                f'<circle cx="{cx:.1f}" cy="{y(p):.1f}" r="5" fill="{color}"/>',
                _text(cx + 12, y(p) + 4, f"{p:.3f}", "start", 11, color, "bold"),
                _text(cx, h - bottom + 16, arm, "middle"),
                _text(cx, h - bottom + 30, f"n={n}  [{lo:.3f}, {hi:.3f}]", "middle", 10, MUTED),
                "</g>"]
    return "\n".join([*out, "</svg>"])


def feature_shift_plot(
    shifts: Sequence[tuple[str, float]],
    threshold: float,
    max_features: int = 15,
    id_: str | None = None,
) -> str:
    """Horizontal bars of standardised shifts, the ``max_features`` largest |shift| first."""
    finite = [(n, s) for n, s in shifts if not math.isnan(s)]
    rows = sorted(finite, key=lambda r: -abs(r[1]))[:max_features]
    w, left, right, top, row_h = 520, 170, 50, 28, 18
    h = top + row_h * max(len(rows), 1) + 30
    span = max([abs(s) for _, s in rows if math.isfinite(s)] + [threshold, 1e-9]) * 1.1
    mid = left + (w - left - right) / 2
    half = (w - left - right) / 2

    def x(v: float) -> float:
        return mid + max(-span, min(span, v)) / span * half

    out = _open("feature-shift", w, h, "Fingerprint shift per feature (standardised)", id_)
    out.append(_text(left, 16, "shift in pooled SDs, candidate minus baseline", "start", 11,
                     MUTED))
    base_y = top + row_h * max(len(rows), 1)
    for t in (-threshold, threshold):
        out.append(_line(x(t), top - 4, x(t), base_y, ALERT, 1, "5 4"))
    out += [_text(x(threshold), base_y + 14, f"+{_fmt(threshold)}", "middle", 10, ALERT),
            _text(x(-threshold), base_y + 14, f"-{_fmt(threshold)}", "middle", 10, ALERT),
            _line(mid, top - 4, mid, base_y, "#57606a", 1)]
    if not rows:
        out.append(_text(mid, top + 12, "no fingerprint features", "middle", 11, MUTED))
    for i, (name, s) in enumerate(rows):
        yy = top + i * row_h
        color = ALERT if abs(s) >= threshold else MUTED
        x0, x1 = sorted((mid, x(s)))
        label = name if len(name) <= 26 else name[:25] + "\u2026"
        value = ("+inf" if s > 0 else "-inf") if math.isinf(s) else f"{s:+.2f}"
        out += [f'<g class="bar"><title>{escape(name)}: {escape(value)}</title>',
                f'<rect x="{x0:.1f}" y="{yy + 3:.1f}" width="{max(x1 - x0, 1):.1f}" '
                f'height="{row_h - 6}" fill="{color}"/>',
                _text(left - 6, yy + row_h / 2 + 4, label, "end"),
                _text(w - right + 4, yy + row_h / 2 + 4, value, "start", 10, color),
                "</g>"]
    return "\n".join([*out, "</svg>"])


def coverage_plot(
    coverage: dict[str, float], c_min: float | None = None, id_: str | None = None
) -> str:
    """Bars on a fixed 0..1 scale, one per dimension, ``overall`` last and bold."""
    names = [k for k in coverage if k != "overall"] + (["overall"] if "overall" in coverage
                                                        else [])
    w, left, right, top, row_h = 400, 80, 50, 24, 20
    h = top + row_h * max(len(names), 1) + 26

    def x(v: float) -> float:
        return left + max(0.0, min(1.0, v)) * (w - left - right)

    out = _open("coverage", w, h, "Coverage per dimension (0 to 1)", id_)
    base_y = top + row_h * max(len(names), 1)
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        out += [_line(x(t), top - 4, x(t), base_y), _text(x(t), base_y + 14, _fmt(t), "middle",
                                                          10, MUTED)]
    if c_min is not None:
        out += [_line(x(c_min), top - 6, x(c_min), base_y, ALERT, 1, "5 4"),
                _text(x(c_min), top - 10, f"C_min {_fmt(c_min)}", "middle", 10, ALERT)]
    for i, name in enumerate(names):
        v = coverage[name]
        yy = top + i * row_h
        good = c_min is None or v >= c_min
        color = OK if good else CANDIDATE
        weight = "bold" if name == "overall" else "normal"
        out += [f'<g class="bar"><title>{escape(name)}: {v:.3f}</title>',
                f'<rect x="{left}" y="{yy + 3:.1f}" width="{max(x(v) - left, 0.5):.1f}" '
                f'height="{row_h - 6}" fill="{color}"/>',
                _text(left - 6, yy + row_h / 2 + 4, name, "end", 11, "#24292f", weight),
                _text(w - right + 4, yy + row_h / 2 + 4, f"{v:.2f}", "start", 10, color),
                "</g>"]
    return "\n".join([*out, "</svg>"])


def sprt_plot(
    path: Sequence[float], bounds: tuple[float, float] | None, id_: str | None = None
) -> str:
    """LLR after each run with the Pass boundary a (below) and the Fail boundary b (above)."""
    w, h, left, right, top, bottom = 520, 240, 48, 90, 16, 36
    values = [v for v in path if math.isfinite(v)]
    lo_b, hi_b = bounds if bounds is not None else (min(values, default=-1.0),
                                                    max(values, default=1.0))
    y_lo = min([lo_b, *values]) - 0.3
    y_hi = max([hi_b, *values]) + 0.3
    n = max(len(path), 1)

    def x(i: float) -> float:
        return left + (i / n) * (w - left - right)

    def y(v: float) -> float:
        return top + (y_hi - v) / (y_hi - y_lo) * (h - top - bottom)

    out = _open("sprt", w, h, "SPRT log-likelihood ratio after each run", id_)
    for t in _ticks(y_lo, y_hi):
        out += [_line(left, y(t), w - right, y(t)), _text(left - 6, y(t) + 4, _fmt(t), "end")]
    for t in _ticks(0, n, 6):
        out.append(_text(x(t), h - bottom + 14, f"{int(t)}", "middle", 10, MUTED))
    out.append(_text(left + (w - left - right) / 2, h - 6, "run", "middle", 11, MUTED))
    if bounds is not None:
        out += [_line(left, y(hi_b), w - right, y(hi_b), ALERT, 1.5, "6 4"),
                _text(w - right + 4, y(hi_b) + 4, f"Fail b={hi_b:.2f}", "start", 10, ALERT),
                _line(left, y(lo_b), w - right, y(lo_b), OK, 1.5, "6 4"),
                _text(w - right + 4, y(lo_b) + 4, f"Pass a={lo_b:.2f}", "start", 10, OK)]
    step = max(1, math.ceil(len(path) / MAX_PATH_POINTS))
    idx = list(range(0, len(path), step))
    if path and idx[-1] != len(path) - 1:
        idx.append(len(path) - 1)
    pts = " ".join(f"{x(i + 1):.1f},{y(path[i]):.1f}" for i in idx if math.isfinite(path[i]))
    out.append(f'<polyline class="llr" points="{x(0):.1f},{y(0.0):.1f} {pts}" fill="none" '
               f'stroke="{BASELINE}" stroke-width="1.8"/>')
    if path and math.isfinite(path[-1]):
        out.append(f'<circle cx="{x(len(path)):.1f}" cy="{y(path[-1]):.1f}" r="3.5" '
                   f'fill="{BASELINE}"/>')
    return "\n".join([*out, "</svg>"])
