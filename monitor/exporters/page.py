"""What the status page and ``GET /api/streams`` say about each stream.

:func:`stream_summary` is the JSON of one stream; :func:`status_page` renders all of them
as a page a person can act on without Grafana: per stream the baseline and the recent pass
rate with their Wilson 95% intervals, the verdicts, and each active alarm with when it
fired (the end time of the run that raised it, UTC, and its index since the baseline
froze) and what moved (the detector's alarmed charts, else the features that moved most
in the recent window, in baseline standard deviations). It never shows run content.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from assaywatch.analyzers.verdicts import wilson_interval
from assaywatch.monitor.engine.streams import (
    DETECTORS,
    StreamState,
    recent_pass_rate,
    split_alarm_name,
)

#: Features listed as "what moved" per stream.
TOP_MOVED = 5


def _v(v: object) -> str | None:
    return None if v is None else str(v)


def _rate(k: int, n: int) -> dict[str, float | int] | None:
    if n <= 0:
        return None
    lo, hi = wilson_interval(k, n, 0.05)
    return {"rate": k / n, "lower": float(lo), "upper": float(hi), "n": n}


def _utc(time_ns: int | None) -> str | None:
    if not time_ns:
        return None
    t = dt.datetime.fromtimestamp(time_ns / 1e9, tz=dt.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def stream_summary(st: StreamState, hold: int) -> dict[str, Any]:
    """One stream, JSON-safe: the ``/api/streams`` record and the status page's row."""
    recent = recent_pass_rate(st)
    base = st.baseline
    onsets: Mapping[str, Mapping[str, Any]] = getattr(st, "alarm_onsets", {}) or {}
    evaluators = getattr(st, "evaluators", {}) or {}
    active = [d for d in st.alarm_keys(DETECTORS)
              if base is not None and st.alarm_active(d, hold)]
    shifts = {k: v for k, v in st.feature_shift.items() if math.isfinite(v)}
    top = sorted(shifts, key=lambda k: -abs(shifts[k]))[:TOP_MOVED]
    alarms = []
    for d in active:
        o = onsets.get(d, {})
        detector, evaluator = split_alarm_name(d)
        alarms.append({"detector": detector, "evaluator": evaluator,
                       "fired_at": _utc(o.get("time_ns")),
                       "run_index": o.get("run_index"), "run_id": o.get("run_id"),
                       "moved": list(o.get("moved") or [])})
    return {
        **st.key.as_labels(),
        "runs": st.n_runs,
        "outcomes": dict(st.outcomes),
        "baseline": None if base is None else {
            "id": base.baseline_id, "runs": base.n_runs,
            "pass_rate": base.pass_rate, "origin": st.baseline_origin,
            "pass_rate_interval": _rate(base.passes, base.passes + base.fails)},
        "learning": base is None,
        #: the baseline froze and its detectors are being calibrated (runs are buffered)
        "calibrating": bool(getattr(st, "calibrating", False)),
        "recent_pass_rate": None if recent is None else recent[0],
        "recent_pass_rate_interval": None if recent is None else {
            "rate": recent[0], "lower": recent[1], "upper": recent[2],
            "n": len(st.recent_outcomes)},
        "verdicts": {"pass_rate": _v(st.pass_rate_verdict), "fingerprint":
                     _v(st.fingerprint_verdict), "sprt": _v(st.sprt_verdict)},
        "active_alarms": active,
        "alarms": alarms,
        "moved": [{"feature": k, "shift_sd": shifts[k]} for k in top],
        "alarms_total": dict(st.alarms_total),
        "hotelling_p_value": st.hotelling_p,
        "disabled_detectors": dict(getattr(st, "disabled", {})),
        "evaluators": [_evaluator(ev, base, st.watch_of(ev.name))
                       for ev in evaluators.values()],
    }


def _evaluator(ev: Any, base: Any, watch: Any) -> dict[str, Any]:
    """One evaluator of a stream: its scores, its baseline and its watch's state."""
    summary = base.evaluators.get(ev.name) if base is not None else None
    labels = getattr(base, "labels", {}).get(ev.name) if base is not None else None
    det = None if watch is None else watch.detector
    baseline: dict[str, Any] | None = None
    if summary is not None:
        baseline = {"n": summary.n, "mean": summary.mean, "scale": [summary.lo, summary.hi]}
    elif labels is not None:  # a labelling evaluator: its label counts
        baseline = {"n": labels.n, "labels": dict(labels.counts)}
    return {"name": ev.name, "scores": ev.count, "recent_mean": ev.recent_mean,
            "recent_n": len(ev.recent),
            "baseline": baseline,
            "monitored": det is not None, "not_monitored_because": ev.disabled or None,
            "statistic": None if det is None else det.statistic,
            "threshold": None if watch is None else watch.threshold}


def _fmt_evaluator(e: Mapping[str, Any]) -> str:
    recent = "-" if e["recent_mean"] is None else f"{e['recent_mean']:.3f}"
    b = e["baseline"]
    if b is None:
        base = "no baseline"
    elif "labels" in b:
        top = sorted(b["labels"].items(), key=lambda kv: -kv[1])[:3]
        base = "baseline labels " + ", ".join(f"{k} {v}" for k, v in top) + f" of {b['n']}"
    else:
        base = f"baseline {b['mean']:.3f} of {b['n']}"
    state = "monitored" if e["monitored"] else f"not monitored: {e['not_monitored_because']}"
    return f"{e['name']}: recent {recent} ({e['recent_n']}), {base}, {state}"


def _fmt_rate(r: Mapping[str, Any] | None) -> str:
    if not r:
        return "-"
    return f"{r['rate']:.3f} [{r['lower']:.3f}, {r['upper']:.3f}] of {r['n']}"


def _e(x: object) -> str:
    return html.escape(str(x))


def _stream_block(s: Mapping[str, Any]) -> str:
    name = f"{s['agent']} {s['version'] or '-'} / {s['scenario'] or '-'}"
    b = s["baseline"]
    if b is None:
        base = "learning its baseline"
    elif s.get("calibrating"):
        base = f"{b['runs']} runs ({_e(b['origin'])}), calibrating its detectors"
    else:
        base = f"{b['runs']} runs ({_e(b['origin'])}), pass rate " \
               f"{_fmt_rate(b.get('pass_rate_interval'))}"
    verdicts = " ".join(f"{k}={v or '-'}" for k, v in s["verdicts"].items())
    alarm_rows = []
    for a in s["alarms"]:
        moved = ", ".join(a["moved"]) or "-"
        what = a["detector"] + (f' ({a["evaluator"]})' if a.get("evaluator") else "")
        alarm_rows.append(
            f'<li class="alarm"><b>{_e(what)}</b> fired at '
            f'<span class="when">{_e(a["fired_at"] or "?")}</span> (run '
            f'{_e(a["run_index"] if a["run_index"] is not None else "?")} since the baseline '
            f'froze); moved: <span class="moved">{_e(moved)}</span></li>')
    alarms = ("<ul>" + "".join(alarm_rows) + "</ul>") if alarm_rows else \
        '<p class="ok">no active alarm</p>'
    moved = ", ".join(f"{m['feature']} {m['shift_sd']:+.2f} sd" for m in s["moved"]) or "-"
    evals = "; ".join(_fmt_evaluator(e) for e in s.get("evaluators", [])) or "-"
    cls = "stream alarmed" if s["alarms"] else "stream"
    return f"""<section class="{cls}"><h2>{_e(name)}</h2>
<table><tr><th>runs</th><td>{s['runs']}</td></tr>
<tr><th>baseline</th><td>{base}</td></tr>
<tr><th>recent pass rate</th><td>{_fmt_rate(s['recent_pass_rate_interval'])}</td></tr>
<tr><th>verdicts</th><td>{_e(verdicts)}</td></tr>
<tr><th>what moved (recent window)</th><td>{_e(moved)}</td></tr>
<tr><th>evaluators</th><td>{_e(evals)}</td></tr></table>
{alarms}</section>"""


def status_page(summaries: Sequence[Mapping[str, Any]], addresses: Mapping[str, str]) -> str:
    """The status page (refreshes every 5 s), streams with active alarms first."""
    ordered = sorted(summaries, key=lambda s: (not s["alarms"], s["agent"], s["version"],
                                               s["scenario"]))
    body = "\n".join(_stream_block(s) for s in ordered) or "<p>no runs received yet</p>"
    n_alarmed = sum(1 for s in summaries if s["alarms"])
    headline = (f'<p class="headline bad">{n_alarmed} of {len(summaries)} streams '
                f"alarmed</p>" if n_alarmed else
                f'<p class="headline">{len(summaries)} streams, no active alarm</p>')
    addrs = ", ".join(f"{k} {v}" for k, v in addresses.items())
    return f"""<!doctype html><html><head><meta charset="utf-8">
<meta http-equiv="refresh" content="5"><title>assaywatch monitor</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:70em}}
th,td{{padding:3px 10px;text-align:left;vertical-align:top}}
section.stream{{border:1px solid #ccc;border-radius:6px;padding:0 1em 1em;margin:1em 0}}
section.alarmed{{border:2px solid #c0392b;background:#fdf2f1}}
li.alarm{{color:#c0392b}} .ok{{color:#1e8449}} .headline{{font-size:1.2em}}
.bad{{color:#c0392b;font-weight:bold}}</style></head><body>
<h1>assaywatch monitor</h1>{headline}
<p>Listening: {_e(addrs)}. JSON: <a href="/api/streams">/api/streams</a>;
Prometheus: <a href="/metrics">/metrics</a>; <a href="/healthz">/healthz</a>,
<a href="/readyz">/readyz</a>.</p>
{body}</body></html>"""
