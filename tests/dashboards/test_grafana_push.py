"""``assaywatch dashboards push`` / ``export``: the real grafana-client against a local server.

No Grafana server can be run here (no Grafana build is reachable), so the push is tested
against a local HTTP server on 127.0.0.1 that implements the few Grafana HTTP API endpoints
the command uses (``GET /api/frontend/settings``, ``GET/POST /api/folders``,
``POST /api/dashboards/db``) with Grafana's answer shapes, and records every request. The
requests are made by the real grafana-client library; what is checked is what reaches the
wire: paths, methods, auth headers and bodies, and the command's answers to 401, 403, an old
version and a closed port.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from assaywatch.dashboards.grafana import load_dashboards
from assaywatch.monitor.commands.cli import main

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
UIDS = {"assaywatch-overview", "assaywatch-agent"}


@dataclass
class FakeGrafana:
    """State and request log of the stand-in Grafana."""

    version: str = "11.3.0"
    status: int = 200  # forced answer for every /api call when not 200
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    folders: dict[str, str] = field(default_factory=dict)  # uid -> title
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> saved body
    url: str = ""

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if self.status != 200:
            return self.status, {"message": "forced failure"}
        if (method, path) == ("GET", "/api/frontend/settings"):
            return 200, {"buildInfo": {"version": self.version, "edition": "Open Source"}}
        if (method, path) == ("GET", "/api/folders"):
            return 200, [{"id": i, "uid": u, "title": t}
                         for i, (u, t) in enumerate(self.folders.items(), 1)]
        if (method, path) == ("POST", "/api/folders"):
            if body["uid"] in self.folders:
                return 409, {"message": "a folder with the same uid already exists"}
            self.folders[body["uid"]] = body["title"]
            return 200, {"uid": body["uid"], "title": body["title"]}
        if (method, path) == ("POST", "/api/dashboards/db"):
            uid = body["dashboard"]["uid"]
            if uid in self.dashboards and not body.get("overwrite"):
                return 412, {"message": "The dashboard has been changed by someone else"}
            version = self.dashboards.get(uid, {}).get("version", 0) + 1
            self.dashboards[uid] = {**body, "version": version}
            return 200, {"status": "success", "uid": uid, "version": version}
        return 404, {"message": "not found"}


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana()

    class Handler(BaseHTTPRequestHandler):
        def _handle(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            path = self.path.split("?")[0]
            fake.requests.append((method, path, dict(self.headers), body))
            status, payload = fake.answer(method, path, body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            self._handle("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._handle("POST")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield fake
    server.shutdown()


def test_push_creates_folder_and_dashboards_then_updates_in_place(
        grafana: FakeGrafana, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "push", "--url", grafana.url, "--token", "s3cret"]) == 0
    assert grafana.folders == {"assaywatch": "assaywatch"}
    assert set(grafana.dashboards) == UIDS
    first = [(m, p) for m, p, _, _ in grafana.requests]
    assert first == [("GET", "/api/frontend/settings"), ("GET", "/api/folders"),
                     ("POST", "/api/folders"), ("POST", "/api/dashboards/db"),
                     ("POST", "/api/dashboards/db")]
    assert all(h.get("Authorization") == "Bearer s3cret" for _, _, h, _ in grafana.requests)
    shipped = load_dashboards(DASHBOARDS)
    for body in grafana.dashboards.values():
        assert body["overwrite"] is True and body["folderUid"] == "assaywatch"
        board = body["dashboard"]
        assert board["id"] is None  # by uid, never by a server-specific numeric id
        original = next(b for b in shipped.values() if b["uid"] == board["uid"])
        assert {**board, "id": None} == {**original, "id": None}
    assert "created folder 'assaywatch'" in capsys.readouterr().out

    # second push: the folder is found by title, the same uids are overwritten
    grafana.requests.clear()
    assert main(["dashboards", "push", "--url", grafana.url, "--token", "s3cret"]) == 0
    assert ("POST", "/api/folders") not in [(m, p) for m, p, _, _ in grafana.requests]
    assert set(grafana.dashboards) == UIDS
    assert {b["version"] for b in grafana.dashboards.values()} == {2}
    assert "existing folder 'assaywatch'" in capsys.readouterr().out


def test_push_with_basic_auth_and_a_custom_folder(grafana: FakeGrafana) -> None:
    assert main(["dashboards", "push", "--url", grafana.url, "--basic-auth", "admin:pw:x",
                 "--folder", "Agents / Prod"]) == 0
    expected = "Basic " + base64.b64encode(b"admin:pw:x").decode()
    assert {h.get("Authorization") for _, _, h, _ in grafana.requests} == {expected}
    assert grafana.folders == {"assaywatch-agents-prod": "Agents / Prod"}
    assert {b["folderUid"] for b in grafana.dashboards.values()} == {"assaywatch-agents-prod"}


def test_push_reads_the_token_from_the_environment(
        grafana: FakeGrafana, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", "from-env")
    assert main(["dashboards", "push", "--url", grafana.url]) == 0
    assert grafana.requests[0][2].get("Authorization") == "Bearer from-env"


@pytest.mark.parametrize(("status", "message"), [(401, "authentication failed (401)"),
                                                 (403, "permission denied (403)"),
                                                 (500, "Server Error 500: forced failure")])
def test_push_errors_exit_3_with_a_message(grafana: FakeGrafana, status: int, message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    grafana.status = status
    assert main(["dashboards", "push", "--url", grafana.url, "--token", "bad"]) == 3
    err = capsys.readouterr().err
    assert message in err and grafana.url in err and "Traceback" not in err
    assert grafana.dashboards == {}


def test_push_refuses_a_grafana_too_old_for_the_schema(
        grafana: FakeGrafana, capsys: pytest.CaptureFixture[str]) -> None:
    grafana.version = "9.5.2"
    assert main(["dashboards", "push", "--url", grafana.url, "--token", "t"]) == 3
    err = capsys.readouterr().err
    assert "Grafana 9.5.2" in err and "older than 10.4" in err
    assert [p for _, p, _, _ in grafana.requests] == ["/api/frontend/settings"]


def test_push_to_a_closed_port_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nothing listens
    assert main(["dashboards", "push", "--url", f"http://127.0.0.1:{port}",
                 "--timeout", "2"]) == 3
    err = capsys.readouterr().err
    assert "cannot reach Grafana" in err and "Traceback" not in err


def test_push_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "push", "--url", "grafana:3000"]) == 3
    assert "must start with http://" in capsys.readouterr().err
    assert main(["dashboards", "push", "--url", "http://x", "--basic-auth", "nocolon"]) == 3
    assert "USER:PASSWORD" in capsys.readouterr().err
    assert main(["dashboards"]) == 3


def test_export_writes_every_asset_ready_for_provisioning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["dashboards", "export", str(out)]) == 0
    written = {Path(line).relative_to(out).as_posix()
               for line in capsys.readouterr().out.split()}
    assert written == {"assaywatch-overview.json", "assaywatch-agent.json",
                       "alerts/assaywatch.rules.yaml",
                       "alerts/tests/assaywatch.rules.test.yaml",
                       "grafana-alerting/assaywatch-alerts.yaml"}
    for rel in written:
        assert (out / rel).read_bytes() == (DASHBOARDS / rel).read_bytes(), rel
    # idempotent: a second export rewrites the same files
    assert main(["dashboards", "export", str(out)]) == 0


def test_export_from_a_folder_without_dashboards_exits_3(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "export", str(tmp_path / "out"),
                 "--source", str(tmp_path)]) == 3
    assert "no dashboard *.json" in capsys.readouterr().err
