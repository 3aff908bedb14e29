"""A real OpenTelemetry Collector (deploy/collector, built from Go modules) for tests.

    from tests.infra.otelcol import otel_collector
    from tests.infra.kafka import kafka_broker

    with kafka_broker() as kafka, otel_collector(
            "deploy/collector/pipelines/kafka-pipeline.yaml",
            env={"ASSAYWATCH_KAFKA_BOOTSTRAP": kafka.bootstrap}) as col:
        export_spans_to(col.grpc_endpoint)   # "127.0.0.1:PORT"

The binary is ``$ASSAYWATCH_OTELCOL`` if set, else ``deploy/collector/bin/assaywatch-otelcol``,
built by ``deploy/collector/build.sh`` when missing or older than its sources (a first build
takes minutes: see tests/infra/README.md). The configs under deploy/collector/pipelines read
their loopback endpoints from ``ASSAYWATCH_OTLP_GRPC``, ``ASSAYWATCH_OTLP_HTTP`` and
``ASSAYWATCH_OTELCOL_HEALTH``; this helper picks free ports for them, waits (bounded) for the
health_check extension to answer 200, and stops the Collector when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.infra.kafka import free_ports

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR_DIR = ROOT / "deploy" / "collector"
BUILD_SH = COLLECTOR_DIR / "build.sh"
DEFAULT_BINARY = COLLECTOR_DIR / "bin" / "assaywatch-otelcol"
PIPELINES = COLLECTOR_DIR / "pipelines"

BUILD_TIMEOUT_S = 1800.0
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


class CollectorError(RuntimeError):
    """The Collector could not be built, or did not start or stop in time."""


def otelcol_binary(build: bool = True, timeout: float = BUILD_TIMEOUT_S) -> Path:
    """The Collector binary: ``$ASSAYWATCH_OTELCOL``, or the one build.sh keeps current."""
    env = os.environ.get("ASSAYWATCH_OTELCOL")
    if env:
        path = Path(env)
        if not path.is_file():
            raise CollectorError(f"ASSAYWATCH_OTELCOL={env} does not exist")
        return path
    if build:
        if shutil.which("go") is None:
            raise CollectorError("building the Collector needs Go >= 1.26 on PATH")
        try:
            res = subprocess.run(["bash", str(BUILD_SH), str(DEFAULT_BINARY)],
                                 capture_output=True, text=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise CollectorError(f"build.sh took over {timeout:.0f}s") from exc
        if res.returncode != 0:
            raise CollectorError("build.sh failed:\n" + (res.stdout + res.stderr)[-4000:])
    if not DEFAULT_BINARY.is_file():
        raise CollectorError(f"{DEFAULT_BINARY} is missing: run {BUILD_SH}")
    return DEFAULT_BINARY


def validate(config: Path | str, env: Mapping[str, str] | None = None) -> None:
    """``assaywatch-otelcol validate --config CONFIG``; raises CollectorError on failure."""
    res = subprocess.run([str(otelcol_binary()), "validate", "--config", str(config)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise CollectorError(f"{config} is invalid:\n{res.stdout}{res.stderr}")


@dataclass
class Collector:
    proc: subprocess.Popen[bytes]
    grpc_endpoint: str
    http_endpoint: str
    health_endpoint: str
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def otel_collector(config: Path | str, env: Mapping[str, str] | None = None,
                   start_timeout: float = START_TIMEOUT_S) -> Iterator[Collector]:
    """Run the Collector with ``config`` until the block ends (see the module docstring)."""
    binary = otelcol_binary()
    grpc, http, health = free_ports(3)
    endpoints = {"ASSAYWATCH_OTLP_GRPC": f"127.0.0.1:{grpc}",
                 "ASSAYWATCH_OTLP_HTTP": f"127.0.0.1:{http}",
                 "ASSAYWATCH_OTELCOL_HEALTH": f"127.0.0.1:{health}"}
    full_env = {**os.environ, **endpoints, **(env or {})}
    folder = Path(tempfile.mkdtemp(prefix="assaywatch-otelcol-"))
    log = folder / "otelcol.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(binary), "--config", str(config)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, start_new_session=True)
    col = Collector(proc=proc, grpc_endpoint=full_env["ASSAYWATCH_OTLP_GRPC"],
                    http_endpoint=full_env["ASSAYWATCH_OTLP_HTTP"],
                    health_endpoint=full_env["ASSAYWATCH_OTELCOL_HEALTH"], log=log)
    try:
        deadline = time.monotonic() + start_timeout
        while not _healthy(f"http://{col.health_endpoint}/"):
            if proc.poll() is not None:
                raise CollectorError(f"the Collector exited with {proc.returncode}:\n"
                                     + col.log_tail())
            if time.monotonic() > deadline:
                raise CollectorError(f"the Collector was not healthy after {start_timeout:.0f}s:"
                                     "\n" + col.log_tail())
            time.sleep(0.2)
        yield col
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        if os.environ.get("ASSAYWATCH_OTELCOL_KEEP"):
            print(f"kept Collector log {log}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
