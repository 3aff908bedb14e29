"""Invalid input to every command exits 3 with one clear message and no traceback.

Table-driven: each case runs the real command line in a subprocess and checks the exit
code, that stderr names the file, key or flag at fault, and that no traceback leaked. An
input problem must never come out as a verdict about the agent (exit 1 or 2 of the gate).
"""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.otel_agent import AgentBehaviour
from tests.monitor.test_gate import write_spans

LOOPBACK = ["--otlp-grpc", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0",
            "--metrics", "127.0.0.1:0"]


@dataclass(frozen=True)
class Case:
    name: str
    #: the command's arguments, built from the case's files
    argv: Callable[[dict[str, Path]], list[str]]
    #: strings stderr must contain (the file, key or flag at fault)
    names: Callable[[dict[str, Path]], list[str]]
    env: tuple[tuple[str, str], ...] = ()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("invalid")
    spans = write_spans(d / "known-good.jsonl", 60, AgentBehaviour(pass_rate=0.9), 1)
    baseline = d / "baseline.json"
    subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "baseline",
                    "build", str(spans), "-o", str(baseline)], check=True,
                   capture_output=True)
    out = {"spans": spans, "baseline": baseline}
    out["empty"] = d / "empty.jsonl"
    out["empty"].write_bytes(b"")
    out["random"] = d / "random.bin"
    out["random"].write_bytes(bytes(range(256)) * 8)
    out["text"] = d / "notes.txt"
    out["text"].write_text("these are not spans\n")
    out["truncated"] = d / "truncated.jsonl.gz"
    out["truncated"].write_bytes(gzip.compress(spans.read_bytes())[:2000])
    out["no_runs"] = d / "no-runs.jsonl"
    out["no_runs"].write_text('{"resourceSpans": []}\n')
    out["contract_typo"] = d / "typo.yaml"
    out["contract_typo"].write_text("contracts:\n  max_step: 3\n")
    out["not_a_number"] = d / "nan.yaml"
    out["not_a_number"].write_text("detectors:\n  arl0: lots\n")
    out["gate_typo"] = d / "gate.yaml"
    out["gate_typo"].write_text("alpah: 0.05\n")
    out["gate_config"] = d / "gate-ok.yaml"
    out["gate_config"].write_text("alpha: 0.05\ndelta: 0.1\n")
    out["monitor_config"] = d / "monitor.yaml"
    out["monitor_config"].write_text("detectors:\n  learn_runs: 300\n")
    out["state_file"] = d / "state-is-a-file"
    out["state_file"].write_text("x")
    out["corrupt_state"] = d / "corrupt-state"
    out["corrupt_state"].mkdir()
    (out["corrupt_state"] / "state.sqlite").write_bytes(b"not sqlite" * 200)
    return out


def _gate(f: dict[str, Path], candidate: str) -> list[str]:
    return ["gate", "--baseline", str(f["baseline"]), "--candidate", str(f[candidate])]


CASES = [
    # gate: candidates that are not span exports of the agent
    *(Case(f"gate-candidate-{c}", lambda f, c=c: _gate(f, c),
           lambda f, c=c: [str(f[c])])
      for c in ("empty", "random", "text", "baseline", "truncated", "no_runs")),
    Case("gate-candidate-missing",
         lambda f: ["gate", "--baseline", str(f["baseline"]), "--candidate",
                    str(f["spans"].with_name("nope.jsonl"))],
         lambda f: ["nope.jsonl"]),
    Case("gate-config-typo",
         lambda f: [*_gate(f, "spans"), "--config", str(f["gate_typo"])],
         lambda f: ["alpah"]),
    Case("gate-given-a-monitor-config",
         lambda f: [*_gate(f, "spans"), "--config", str(f["monitor_config"])],
         lambda f: [str(f["monitor_config"]), "looks like a monitor config"]),
    Case("replay-given-a-gate-config",
         lambda f: ["replay", str(f["spans"]), "--config", str(f["gate_config"])],
         lambda f: [str(f["gate_config"]), "looks like a gate config"]),
    Case("gate-baseline-spans-empty",
         lambda f: ["gate", "--baseline", str(f["empty"]), "--candidate", str(f["spans"])],
         lambda f: [str(f["empty"])]),
    # baseline build
    *(Case(f"baseline-build-{c}",
           lambda f, c=c: ["baseline", "build", str(f[c]), "-o",
                           str(f["spans"].with_name(f"out-{c}.json"))],
           lambda f, c=c: [str(f[c])])
      for c in ("empty", "text", "truncated", "no_runs")),
    # replay
    Case("replay-empty", lambda f: ["replay", str(f["empty"])],
         lambda f: [str(f["empty"])]),
    Case("replay-contract-typo",
         lambda f: ["replay", str(f["spans"]), "--config", str(f["contract_typo"])],
         lambda f: ["max_step", str(f["contract_typo"])]),
    Case("replay-not-a-number",
         lambda f: ["replay", str(f["spans"]), "--config", str(f["not_a_number"])],
         lambda f: ["arl0", "lots"]),
    # monitor: every problem is found before it serves anything
    Case("monitor-contract-typo",
         lambda f: ["monitor", "--config", str(f["contract_typo"]), *LOOPBACK],
         lambda f: ["max_step"]),
    Case("monitor-not-a-number",
         lambda f: ["monitor", "--config", str(f["not_a_number"]), *LOOPBACK],
         lambda f: ["arl0"]),
    Case("monitor-state-dir-is-a-file",
         lambda f: ["monitor", "--state-dir", str(f["state_file"]), *LOOPBACK],
         lambda f: [str(f["state_file"])]),
    Case("monitor-corrupt-state",
         lambda f: ["monitor", "--state-dir", str(f["corrupt_state"]), *LOOPBACK],
         lambda f: [str(f["corrupt_state"] / "state.sqlite"), "left untouched"]),
    Case("monitor-bad-address",
         lambda f: ["monitor", "--otlp-grpc", "nonsense", "--metrics", "127.0.0.1:0"],
         lambda f: ["--otlp-grpc", "nonsense"]),
    # demo
    Case("demo-bad-metrics", lambda f: ["demo", "--metrics", "nonsense"],
         lambda f: ["--metrics", "nonsense"]),
    Case("demo-bad-runs-variable", lambda f: ["demo"], lambda f: ["ASSAYWATCH_DEMO_RUNS"],
         env=(("ASSAYWATCH_DEMO_RUNS", "many"),)),
]


def _run(argv: list[str], env: dict[str, str] | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", *argv],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_invalid_input_exits_3_naming_the_culprit(case: Case, files: dict[str, Path]) -> None:
    before = (files["corrupt_state"] / "state.sqlite").read_bytes()
    r = _run(case.argv(files), dict(case.env))
    assert r.returncode == 3, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    error_lines = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert error_lines, r.stderr
    for needle in case.names(files):
        assert needle in r.stderr, f"{needle!r} not named in:\n{r.stderr}"
    assert "gate: BLOCK" not in r.stdout and "gate: MANUAL" not in r.stdout
    # nothing overwrote the state the monitor could not read
    assert (files["corrupt_state"] / "state.sqlite").read_bytes() == before


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("flag", ["--otlp-grpc", "--otlp-http", "--metrics"])
def test_monitor_on_a_busy_port_exits_3(flag: str, busy_port: int) -> None:
    argv = ["monitor", *LOOPBACK]
    argv[argv.index(flag) + 1] = f"127.0.0.1:{busy_port}"
    r = _run(argv)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"127.0.0.1:{busy_port}" in r.stderr and flag in r.stderr
    assert "Traceback" not in r.stderr


def test_second_monitor_on_the_same_grpc_port_exits_3(tmp_path: Path) -> None:
    """gRPC binds with SO_REUSEPORT unless told not to: the second monitor would start
    and silently take part of the first one's traffic."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = subprocess.Popen(
        [sys.executable, "-m", "assaywatch.monitor.commands.cli", "monitor", "--otlp-grpc",
         f"127.0.0.1:{port}", "--otlp-http", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        assert "listening" in first.stdout.readline()
        second = _run(["monitor", "--otlp-grpc", f"127.0.0.1:{port}", "--otlp-http",
                       "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
        assert second.returncode == 3, second.stdout + second.stderr
        assert "OTLP/gRPC" in second.stderr and f"127.0.0.1:{port}" in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=30)
