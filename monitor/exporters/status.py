"""The metrics port: ``/metrics``, ``/healthz``, ``/readyz``, the status page ``/`` and a
small JSON API (``GET /api/streams``, ``POST /api/rebaseline``)."""

from __future__ import annotations

import html
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import DETECTORS, StreamState, recent_pass_rate
from assaywatch.monitor.exporters.prometheus import MonitorCollector
from assaywatch.monitor.receivers.spans import IngestCounters

logger = logging.getLogger(__name__)


class PipelineView(Protocol):
    """What the metrics port reads of the service's pipeline."""

    lock: Any  # the pipeline lock (an RLock) the engine is read under

    def pending_traces(self) -> int: ...


class MonitorView(Protocol):
    """What the metrics port reads of the running monitor (``service.monitor.Monitor``).

    A protocol, so the exporters stage depends on nothing of the service that wires it.
    """

    engine: Engine
    counters: IngestCounters
    pipeline: PipelineView
    ready: threading.Event
    addresses: dict[str, str]


def stream_summary(st: StreamState, hold: int) -> dict[str, Any]:
    recent = recent_pass_rate(st)
    return {
        **st.key.as_labels(),
        "runs": st.n_runs,
        "outcomes": dict(st.outcomes),
        "baseline": None if st.baseline is None else {
            "id": st.baseline.baseline_id, "runs": st.baseline.n_runs,
            "pass_rate": st.baseline.pass_rate, "origin": st.baseline_origin},
        "learning": st.baseline is None,
        "recent_pass_rate": None if recent is None else recent[0],
        "verdicts": {"pass_rate": _v(st.pass_rate_verdict), "fingerprint":
                     _v(st.fingerprint_verdict), "sprt": _v(st.sprt_verdict)},
        "active_alarms": [d for d in DETECTORS
                          if st.baseline is not None and st.alarm_active(d, hold)],
        "alarms_total": dict(st.alarms_total),
        "hotelling_p_value": st.hotelling_p,
        "disabled_detectors": dict(getattr(st, "disabled", {})),
    }


def _v(v: object) -> str | None:
    return None if v is None else str(v)


class StatusServer:
    def __init__(self, monitor: MonitorView, host: str, port: int) -> None:
        self.monitor = monitor
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(MonitorCollector(
            monitor.engine, monitor.counters, monitor.pipeline.lock,
            monitor.pipeline.pending_traces))
        handler = type("Handler", (_Handler,), {"server_ref": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="assaywatch-status", daemon=True)
        self._thread.start()
        return int(self.httpd.server_address[1])

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def summaries(self) -> list[dict[str, Any]]:
        hold = self.monitor.engine.config.alarm_hold_runs
        with self.monitor.pipeline.lock:
            return [stream_summary(st, hold) for st in self.monitor.engine.streams()]


class _Handler(BaseHTTPRequestHandler):
    server_ref: StatusServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("status: " + format, *args)

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # the client gave up (a scrape timeout): nothing to answer, nothing to log
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        srv = self.server_ref
        try:
            if path == "/metrics":
                self._send(200, generate_latest(srv.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain; charset=utf-8")
            elif path == "/readyz":
                ready = srv.monitor.ready.is_set()
                self._send(200 if ready else 503, b"ready\n" if ready else b"starting\n",
                           "text/plain; charset=utf-8")
            elif path == "/api/streams":
                body = json.dumps({"streams": srv.summaries(),
                                   "addresses": srv.monitor.addresses}, default=str)
                self._send(200, body.encode(), "application/json")
            elif path == "/":
                self._send(200, _status_page(srv).encode(), "text/html; charset=utf-8")
            else:
                self._send(404, b"not found: try /, /metrics, /healthz, /readyz\n",
                           "text/plain; charset=utf-8")
        except Exception:
            logger.exception("status request %s failed", path)
            self._send(500, b"internal error\n", "text/plain; charset=utf-8")

    def do_POST(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        if parts.path != "/api/rebaseline":
            self._send(404, b"not found\n", "text/plain; charset=utf-8")
            return
        q = {k: v[0] for k, v in parse_qs(parts.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            try:
                q.update(json.loads(self.rfile.read(min(length, 65536))))
            except (ValueError, TypeError):
                self._send(400, b'{"error": "body must be a JSON object"}', "application/json")
                return
        if "agent" not in q:
            self._send(400, b'{"error": "give agent (and version, scenario)"}',
                       "application/json")
            return
        key = StreamKey(str(q["agent"]), str(q.get("version", "")), str(q.get("scenario", "")))
        mon = self.server_ref.monitor
        with mon.pipeline.lock:
            ok = mon.engine.rebaseline(key)
        body = json.dumps({"stream": key.as_labels(), "rebaselined": ok}).encode()
        self._send(200 if ok else 404, body, "application/json")


def _status_page(srv: StatusServer) -> str:
    rows = []
    for s in srv.summaries():
        alarms = ", ".join(s["active_alarms"]) or "none"
        state = "learning baseline" if s["learning"] else (
            f"baseline {s['baseline']['runs']} runs ({s['baseline']['origin']})")
        rate = "-" if s["recent_pass_rate"] is None else f"{s['recent_pass_rate']:.3f}"
        verdicts = " ".join(f"{k}={v or '-'}" for k, v in s["verdicts"].items())
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            s["agent"], s["version"], s["scenario"], s["runs"], state, rate, verdicts,
            alarms)) + "</tr>")
    body = "\n".join(rows) or '<tr><td colspan="8">no runs received yet</td></tr>'
    addrs = ", ".join(f"{k} {v}" for k, v in srv.monitor.addresses.items())
    return f"""<!doctype html><html><head><meta charset="utf-8">
<meta http-equiv="refresh" content="5"><title>assaywatch monitor</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 10px;text-align:left}}
tr:nth-child(even){{background:#f4f4f4}}</style></head><body>
<h1>assaywatch monitor</h1><p>Listening: {html.escape(addrs)}.
Metrics at <a href="/metrics">/metrics</a>.</p>
<table><tr><th>agent</th><th>version</th><th>scenario</th><th>runs</th><th>baseline</th>
<th>recent pass rate</th><th>verdicts</th><th>active alarms</th></tr>
{body}</table></body></html>"""
