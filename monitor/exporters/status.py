"""The metrics port: ``/metrics``, ``/healthz``, ``/readyz``, the status page ``/`` and a
small JSON API (``GET /api/streams``, ``POST /api/rebaseline``).

**Reading** (every ``GET``) is open to whoever reaches the port, as Prometheus needs.

**Changing state** (``POST /api/rebaseline``) requires all of:

* ``Authorization: Bearer TOKEN``: the token is ``ASSAYWATCH_API_TOKEN``, else the file
  ``api-token`` in the state dir (created at the first start, mode 0600, when a state dir
  is given and the variable is not). With neither, mutating endpoints are disabled: 403
  with a message saying how to enable them. A wrong or missing token is 401;
* a ``Host`` that is a loopback name (``localhost``, ``*.localhost``), an IP address, the
  bound address or a name listed in ``ASSAYWATCH_ALLOWED_HOSTS`` (comma-separated;
  ``*.example.org`` allows subdomains): a DNS-rebinding page sends its own name, 403;
* no ``Origin`` header, or the server's own origin (``http://`` + Host); a cross-origin
  page, ``Origin: null`` or ``Sec-Fetch-Site: cross-site`` is 403;
* ``Content-Type: application/json`` (415 otherwise: an HTML form's "simple request"
  cannot send it) and a JSON object body of at most 64 KiB with a valid
  ``Content-Length`` (411 / 400 / 413 otherwise).

Every state change is a line of the event log (``exporters/events.py``, in the state dir)
and a log record, with the caller's token id (a SHA-256 prefix) and remote address.

**Reading never waits on the pipeline**: ``/metrics`` is rendered from a snapshot of the
streams' state (``MonitorCollector``: refreshed when the pipeline lock is free within
0.2 s, else served as last taken while a background thread retries), and the page and
``GET /api/streams`` fall back to the summaries last read after 0.5 s.

The port runs on :class:`~assaywatch.monitor.receivers.otlp.http_server.HardenedHTTPServer`
(64 connections, a 60 s deadline per request, a 128 backlog). A label value that cannot be
encoded as UTF-8 (a lone surrogate in a stream kept from an older version, say) is
repaired in the exposition instead of failing every scrape.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.exporters.events import EventLog, state_change, token_id
from assaywatch.monitor.exporters.page import status_page, stream_summary
from assaywatch.monitor.exporters.prometheus import STATUS_BUDGET_S, MonitorCollector
from assaywatch.monitor.receivers.otlp.http_server import (
    DeadlineRequestHandler,
    HardenedHTTPServer,
)
from assaywatch.monitor.receivers.spans import IngestCounters

#: The API token (bearer) for endpoints that change state.
TOKEN_ENV = "ASSAYWATCH_API_TOKEN"
#: Extra Host names accepted by endpoints that change state (comma-separated).
ALLOWED_HOSTS_ENV = "ASSAYWATCH_ALLOWED_HOSTS"
#: The token file in the state dir.
TOKEN_FILE = "api-token"
#: Largest API request body.
MAX_API_BODY = 64 * 1024
#: Longest agent / version / scenario accepted by the API (as at the OTLP edge).
_MAX_KEY_CHARS = 256
#: Longest wait for the pipeline lock before the page and ``GET /api/streams`` answer
#: with the summaries last read.
PAGE_LOCK_WAIT_S = 0.5

logger = logging.getLogger(__name__)


class PipelineView(Protocol):
    """What the metrics port reads of the service's pipeline."""

    lock: Any  # the pipeline lock (an RLock) the engine is read under

    def pending_traces(self) -> int: ...

    # optional: ``join_counts() -> dict[str, int]``, the evaluation join's counts


class MonitorView(Protocol):
    """What the metrics port reads of the running monitor (``service.monitor.Monitor``).

    A protocol, so the exporters stage depends on nothing of the service that wires it.
    """

    engine: Engine
    counters: IngestCounters
    pipeline: PipelineView
    ready: threading.Event
    addresses: dict[str, str]
    #: The event log, or None without a state dir.
    events: EventLog | None


def load_token(state_dir: str | os.PathLike[str] | None,
               env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The API token and where it came from (``env``, ``file`` or ``none``).

    ``ASSAYWATCH_API_TOKEN`` wins; else ``STATE_DIR/api-token`` is read, or created with a
    fresh random token (mode 0600) when the state dir exists and has none.
    """
    env = os.environ if env is None else env
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        return token, "env"
    if not state_dir:
        return None, "none"
    path = Path(state_dir) / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        try:
            token = path.read_text(encoding="utf-8").strip()
            mode = path.stat().st_mode
        except OSError as exc:
            logger.error("cannot read the API token file %s (%s): mutating endpoints are "
                         "disabled", path, exc.strerror)
            return None, "none"
        if mode & 0o077:
            logger.warning("the API token file %s is readable by other users (mode %o); "
                           "chmod 600 it", path, mode & 0o777)
        if not token:
            logger.error("the API token file %s is empty: mutating endpoints are disabled",
                         path)
            return None, "none"
        return token, "file"
    except OSError as exc:
        logger.error("cannot create the API token file %s (%s): mutating endpoints are "
                     "disabled", path, exc.strerror)
        return None, "none"
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    logger.info("created the API token file %s (token id %s)", path, token_id(token))
    return token, "file"


def _host_name(host_header: str) -> str | None:
    """The host of a Host header without its port, lower case; None when malformed."""
    h = host_header.strip().lower()
    if not h:
        return None
    if h.startswith("["):
        end = h.find("]")
        if end < 0 or (h[end + 1:] and not h[end + 1:].startswith(":")):
            return None
        return h[1:end]
    name, sep, port = h.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        return name
    if ":" in h:  # a bare IPv6 address is not a valid Host
        return None
    return h


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class AccessPolicy:
    """Who may call the endpoints that change state (see the module docstring)."""

    def __init__(self, token: str | None, token_source: str, bound_host: str,
                 allowed_hosts: list[str] | None = None) -> None:
        self.token = token
        self.token_source = token_source
        self.bound_host = bound_host.strip("[]").lower()
        self.allowed_hosts = [h.strip().lower() for h in (allowed_hosts or []) if h.strip()]

    @classmethod
    def from_env(cls, state_dir: str | None, bound_host: str,
                 env: Mapping[str, str] | None = None) -> AccessPolicy:
        env = os.environ if env is None else env
        token, source = load_token(state_dir, env)
        allowed = env.get(ALLOWED_HOSTS_ENV, "").split(",")
        return cls(token, source, bound_host, allowed)

    def host_allowed(self, host_header: str | None) -> bool:
        name = _host_name(host_header or "")
        if name is None:
            return False
        if name == "localhost" or name.endswith(".localhost") or _is_ip(name):
            return True
        if name == self.bound_host:
            return True
        for allowed in self.allowed_hosts:
            host = _host_name(allowed) or allowed
            if host == "*" or name == host:
                return True
            if host.startswith("*.") and name.endswith(host[1:]):
                return True
        return False

    def origin_allowed(self, origin: str | None, host_header: str | None,
                       fetch_site: str | None) -> bool:
        if (fetch_site or "").strip().lower() == "cross-site":
            return False
        if origin is None:
            return True  # not sent by a browser page: the token still decides
        host = (host_header or "").strip().lower()
        return origin.strip().lower() in (f"http://{host}", f"https://{host}")

    def token_ok(self, authorization: str | None) -> str | None:
        """The presented token when it is the right one, else None."""
        if self.token is None or not authorization:
            return None
        scheme, _, presented = authorization.strip().partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            return None
        if hmac.compare_digest(presented.encode("utf-8", "replace"),
                               self.token.encode("utf-8")):
            return presented
        return None


#: State-changing endpoints: path -> (event logged, answer field, engine method).
_ACTIONS = {"/api/rebaseline": ("rebaseline", "rebaselined", "rebaseline"),
            "/api/streams/delete": ("stream_deleted", "deleted", "delete_stream")}


class _RepairedRegistry:
    """A registry view whose label values are valid UTF-8 (lone surrogates replaced)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for fam in self.registry.collect():
            fam.samples = [s._replace(labels={k: _utf8(v) for k, v in s.labels.items()})
                           for s in fam.samples]
            yield fam


def _utf8(s: str) -> str:
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


class StatusServer:
    def __init__(self, monitor: MonitorView, host: str, port: int,
                 policy: AccessPolicy | None = None) -> None:
        self.monitor = monitor
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = MonitorCollector(monitor.engine, monitor.counters,
                                          monitor.pipeline.lock,
                                          monitor.pipeline.pending_traces,
                                          joins=getattr(monitor.pipeline, "join_counts",
                                                        None))
        self.registry.register(self.collector)
        #: the last stream summaries read (served when the pipeline lock stays busy)
        self._summaries: list[dict[str, Any]] = []
        self._summaries_lock = threading.Lock()
        if policy is None:
            config = getattr(monitor, "config", None)
            policy = AccessPolicy.from_env(getattr(config, "state_dir", None) or None, host)
        self.policy = policy
        handler = type("Handler", (_Handler,), {"server_ref": self})
        self.httpd = HardenedHTTPServer((host, port), handler)
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        self.collector.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="assaywatch-status", daemon=True)
        self._thread.start()
        return int(self.httpd.server_address[1])

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.collector.stop()

    def summaries(self) -> list[dict[str, Any]]:
        """Per-stream summaries for the page and ``/api/streams``: read under the pipeline
        lock when it is free within :data:`PAGE_LOCK_WAIT_S`, else the last ones read (a
        person's page, like a scrape, never waits on an overloaded pipeline)."""
        hold = self.monitor.engine.config.alarm_hold_runs
        lock = self.monitor.pipeline.lock
        with self._summaries_lock:
            if lock.acquire(timeout=PAGE_LOCK_WAIT_S):
                try:
                    # due statuses within the snapshots' budget, as /metrics
                    self.monitor.engine.settle(STATUS_BUDGET_S)
                    self._summaries = [stream_summary(st, hold)
                                       for st in self.monitor.engine.streams(settle=False)]
                finally:
                    lock.release()
            return list(self._summaries)


class _Handler(DeadlineRequestHandler):
    server_ref: StatusServer
    server_version = "assaywatch-status"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("status: " + format, *args)

    def _metrics(self) -> tuple[bytes, dict[str, str]]:
        """The exposition, and its ``X-Assaywatch-Snapshot-Age`` header: seconds since the
        stream families were read (the edge counters are read now)."""
        registry = self.server_ref.registry
        # the stream families first: the registry's collect then reads the same snapshot
        streams, age = self.server_ref.collector.stream_exposition_aged()
        headers = {} if age is None else {"X-Assaywatch-Snapshot-Age": f"{age:.3f}"}
        try:
            return generate_latest(registry) + streams, headers
        except UnicodeEncodeError:
            logger.warning("a metric label is not valid UTF-8; exposing it repaired")
            return (generate_latest(_RepairedRegistry(registry))  # type: ignore[arg-type]
                    + streams, headers)

    def do_GET(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        srv = self.server_ref
        try:
            if path == "/metrics":
                body, headers = self._metrics()
                self.send_answer(200, body, CONTENT_TYPE_LATEST, headers)
            elif path == "/healthz":
                self.send_answer(200, b"ok\n", "text/plain; charset=utf-8")
            elif path == "/readyz":
                ready = srv.monitor.ready.is_set()
                self.send_answer(200 if ready else 503, b"ready\n" if ready else b"starting\n",
                                 "text/plain; charset=utf-8")
            elif path == "/api/streams":
                body = json.dumps({"streams": srv.summaries(),
                                   "addresses": srv.monitor.addresses}, default=str)
                self.send_answer(200, body.encode(), "application/json")
            elif path == "/":
                page = status_page(srv.summaries(), srv.monitor.addresses)
                self.send_answer(200, page.encode("utf-8", "replace"),
                                 "text/html; charset=utf-8")
            else:
                self.send_answer(404, b"not found: try /, /metrics, /healthz, /readyz\n",
                                 "text/plain; charset=utf-8")
        except Exception:
            logger.exception("status request %s failed", path)
            self.send_answer(500, b"internal error\n", "text/plain; charset=utf-8")

    def _refuse(self, code: int, message: str, headers: dict[str, str] | None = None,
                close: bool = True) -> None:
        logger.warning("refused %s %s from %s: %d %s", self.command, self.path,
                       self.client_address[0], code, message)
        self.send_answer(code, json.dumps({"error": message}).encode(), "application/json",
                         headers, close=close)

    def do_POST(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        action = _ACTIONS.get(parts.path)
        if action is None:
            self.send_answer(404, b"not found\n", "text/plain; charset=utf-8", close=True)
            return
        policy = self.server_ref.policy
        host = self.headers.get("Host")
        if not policy.host_allowed(host):
            self._refuse(403, f"Host {host!r} is not this monitor's: use a loopback name, an "
                         f"IP address, or list the name in {ALLOWED_HOSTS_ENV}")
            return
        if not policy.origin_allowed(self.headers.get("Origin"), host,
                                     self.headers.get("Sec-Fetch-Site")):
            self._refuse(403, "cross-origin requests may not change the monitor's state")
            return
        if policy.token is None:
            self._refuse(403, "endpoints that change state are disabled: set "
                         f"{TOKEN_ENV} in the monitor's environment, or run it with "
                         f"--state-dir (a token is created in STATE_DIR/{TOKEN_FILE})")
            return
        token = policy.token_ok(self.headers.get("Authorization"))
        if token is None:
            self._refuse(401, "a valid 'Authorization: Bearer TOKEN' header is required "
                         f"(the token is {TOKEN_ENV} or STATE_DIR/{TOKEN_FILE})",
                         {"WWW-Authenticate": 'Bearer realm="assaywatch"'})
            return
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            self._refuse(415, "send a JSON object with Content-Type: application/json")
            return
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "send the body with a Content-Length")
            return
        length_text = (self.headers.get("Content-Length") or "").strip()
        if not length_text.isdigit():
            self._refuse(411 if not length_text else 400,
                         f"a valid Content-Length is required, got {length_text!r}")
            return
        length = int(length_text)
        if length > MAX_API_BODY:
            self._refuse(413, f"body of {length} bytes exceeds {MAX_API_BODY} bytes")
            return
        try:
            raw = self.rfile.read(length)
        except OSError:  # timed out or reset: nothing to answer
            self.close_connection = True
            return
        if len(raw) != length:
            self.close_connection = True
            return
        try:
            q = json.loads(raw)
        except (ValueError, RecursionError):
            q = None
        if not isinstance(q, dict):
            self._refuse(400, "body must be a JSON object", close=False)
            return
        fields = {k: q.get(k, "") for k in ("agent", "version", "scenario")}
        if not fields["agent"] or not all(isinstance(v, str) and len(v) <= _MAX_KEY_CHARS
                                          for v in fields.values()):
            self._refuse(400, "give agent (and version, scenario) as strings of at most "
                         f"{_MAX_KEY_CHARS} characters", close=False)
            return
        key = StreamKey(fields["agent"], fields["version"], fields["scenario"])
        mon = self.server_ref.monitor
        event, done, method = action
        with mon.pipeline.lock:
            ok = bool(getattr(mon.engine, method)(key))
        remote = self.client_address[0]
        record = state_change(event, {**key.as_labels(), done: ok}, token, remote)
        logger.warning("%s of %s by token %s from %s: %s", event, key,
                       record["by"]["token_id"], remote, "done" if ok else "no such stream")
        events = getattr(mon, "events", None)
        if events is not None and ok:
            events.append(record)
        if ok:
            self.server_ref.collector.invalidate()
        body = json.dumps({"stream": key.as_labels(), done: ok}).encode()
        self.send_answer(200 if ok else 404, body, "application/json")
