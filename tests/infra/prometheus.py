"""A real Prometheus for the end-to-end tests: ``prometheus_server(folder, targets)``.

The Debian ``prometheus`` binary (``.ci/run`` installs it; :data:`PROMETHEUS` is None when
it is not on PATH) scraping ``targets`` as one job every second, with the shipped alert
rules, on a free loopback port and a store under ``folder``; stopped on exit. Standard
library only.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

PROMETHEUS = shutil.which("prometheus")
RULES = Path(__file__).resolve().parents[2] / "dashboards" / "alerts" / "*.yaml"
READY_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def prometheus_server(folder: Path, targets: str | Sequence[str]) -> Iterator[str]:
    """A real Prometheus scraping ``targets`` (host:port) every second with the shipped
    rules; yields its base URL."""
    if PROMETHEUS is None:
        raise RuntimeError("the prometheus binary is not on PATH (apt-get install prometheus)")
    config = folder / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML; 1 s scrapes keep the tests to seconds
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "assaywatch", "static_configs": [
            {"targets": [targets] if isinstance(targets, str) else list(targets)}]}],
    }))
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
         f"--web.listen-address={address}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://{address}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _ready(base, proc):
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus not ready after {READY_TIMEOUT_S:.0f}s")
            time.sleep(0.25)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def query(base: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result; a Prometheus error (bad data, many-to-many matching)
    fails with its message."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        answer = get_json(url)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{expr}: {exc.code} {exc.read().decode()[:500]}") from exc
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def wait(what: str, check: Callable[[], Any], timeout: float = 30.0,
         last: Callable[[], Any] | None = None) -> Any:
    """``check()`` once it is truthy (an OSError counts as not yet); AssertionError naming
    ``what`` (and ``last()``, what was seen) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except OSError:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            seen = f"; last seen: {last()!r}" if last is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{seen}")
        time.sleep(0.25)


def _ready(base: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        raise AssertionError(f"prometheus exited with {proc.returncode}: {stderr[-2000:]}")
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
