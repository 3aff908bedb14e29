"""The shipped admission proxy (``deploy/admission/haproxy.cfg``), run by tests.

A real HAProxy (Debian's package, installed by ``.ci/run``) with the configuration file
users deploy, unchanged: only its addresses come from the environment, as the file
documents. :class:`AdmissionProxy` starts it in front of a running monitor on free
loopback ports and stops it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from prometheus_client.parser import text_string_to_metric_families

from tests.infra.kafka import free_ports

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "admission" / "haproxy.cfg"


def haproxy_binary() -> str | None:
    """The ``haproxy`` command, or None when it is not installed."""
    return shutil.which("haproxy")


def _wait_listening(address: str, deadline: float) -> None:
    host, port = address.rsplit(":", 1)
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class AdmissionProxy:
    """HAProxy with ``deploy/admission/haproxy.cfg`` in front of a monitor's OTLP/HTTP
    and OTLP/gRPC receivers (``monitor_http``, ``monitor_grpc``: host:port)."""

    def __init__(self, monitor_http: str, monitor_grpc: str) -> None:
        binary = haproxy_binary()
        if binary is None:
            raise FileNotFoundError("the `haproxy` command is not installed (CI installs "
                                    "Debian's haproxy package)")
        self.binary = binary
        http, grpc_, stats = free_ports(3)
        self.http = f"127.0.0.1:{http}"
        self.grpc = f"127.0.0.1:{grpc_}"
        self.stats = f"127.0.0.1:{stats}"
        self.env = {**os.environ, "ASSAYWATCH_ADMISSION_HTTP": self.http,
                    "ASSAYWATCH_ADMISSION_GRPC": self.grpc,
                    "ASSAYWATCH_ADMISSION_STATS": self.stats,
                    "ASSAYWATCH_MONITOR_HTTP": monitor_http,
                    "ASSAYWATCH_MONITOR_GRPC": monitor_grpc}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AdmissionProxy:
        check = subprocess.run([self.binary, "-c", "-q", "-f", str(CONFIG)], env=self.env,
                               capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, f"haproxy -c failed:\n{check.stderr[-2000:]}"
        self.proc = subprocess.Popen([self.binary, "-f", str(CONFIG)], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        for address in (self.http, self.grpc, self.stats):
            _wait_listening(address, deadline)
        return self

    def metrics(self) -> str:
        """The proxy's Prometheus exposition (its built-in exporter)."""
        with urllib.request.urlopen(f"http://{self.stats}/metrics", timeout=10) as r:
            text: str = r.read().decode()
        return text

    def answers_5xx(self, frontend: str | None = None) -> float:
        """5xx answers the proxy gave on ``frontend`` (``otlp_http``, ``otlp_grpc``; None:
        all): its refusals, and the monitor's passed through
        (``haproxy_frontend_http_responses_total{code="5xx"}``)."""
        return sum(x.value for fam in text_string_to_metric_families(self.metrics())
                   if fam.name == "haproxy_frontend_http_responses" for x in fam.samples
                   if x.labels.get("code") == "5xx"
                   and frontend in (None, x.labels.get("proxy")))

    def stop(self) -> int:
        """Stop (SIGTERM: HAProxy's hard stop; it exits by the signal, -15) and return the
        exit code."""
        if self.proc is None:
            return 0
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        self.proc = None
        return code

    def __enter__(self) -> AdmissionProxy:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
