"""The live gate through its real path: CLI, embedded OTLP receiver, candidate processes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

AGENT = Path(__file__).with_name("sim_agent.py")
CMD = f"{sys.executable} {AGENT}"
BASE_ENV = {"SIM_PASS_RATE": "0.9", "SIM_TOOLS": "search:0.5,lookup:0.5", "SIM_SEED": "1"}


def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, **BASE_ENV, **kw}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("live")
    spans = d / "base.jsonl"
    subprocess.run([sys.executable, str(AGENT), "--spans", str(spans), "200", "refund"],
                   env=_env(SIM_SEED="100"), check=True)
    out = d / "baseline.json"
    subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "baseline", "build",
                    str(spans), "-o", str(out)], check=True, capture_output=True)
    return out


def _gate(baseline: Path, *extra: str, env: dict[str, str], cmd: str = CMD,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "gate",
                           "--baseline", str(baseline), "--run", cmd, *extra],
                          env=env, capture_output=True, text=True, timeout=timeout)


def _runs(out: str) -> int:
    line = next(s for s in out.splitlines() if s.startswith("spent "))
    return int(line.split()[1])


def test_unchanged_candidate_deploys(baseline: Path, tmp_path: Path) -> None:
    junit = tmp_path / "gate.xml"
    r = _gate(baseline, "--loop", "--junit", str(junit), env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gate: DEPLOY" in r.stdout and "sprt         pass" in r.stdout
    n = _runs(r.stdout)
    assert 10 < n < 232  # decided well before the fixed-n design's 232 runs
    xml = junit.read_text()
    assert 'name="spend.runs"' in xml and 'name="sprt.llr"' in xml


def test_regressed_candidate_blocks_with_parallel_jobs(baseline: Path) -> None:
    r = _gate(baseline, "--loop", "--jobs", "2", env=_env(SIM_PASS_RATE="0.75"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "sprt         fail" in r.stdout and _runs(r.stdout) < 232


def test_tool_mix_change_is_caught_by_the_fingerprint_test(baseline: Path) -> None:
    unchanged = _gate(baseline, "--loop", env=_env())
    swapped = _gate(baseline, "--loop", env=_env(SIM_TOOLS="search:0.5,calc:0.5"))
    assert swapped.returncode == 2, swapped.stdout + swapped.stderr
    assert "fingerprint  fail" in swapped.stdout and "tool:lookup" in swapped.stdout
    # The pass-rate test cannot see the swap; the fingerprint test stops the stream first.
    assert _runs(swapped.stdout) < _runs(unchanged.stdout)


def _crashes(seed: str, scenario: str, indices: range, p: float) -> list[bool]:
    """Which runs sim_agent crashes, by its documented (seed, scenario, index) draw."""
    return [random.Random(f"{seed}:{scenario}:{i}:crash").random() < p for i in indices]


def test_crashing_candidate_counts_failed_runs_and_blocks(baseline: Path) -> None:
    # a third of the invocations crash before their run: each is a failed run, and a
    # 0.9 agent that fails a third of the time more is a regression
    seed = BASE_ENV.get("SIM_SEED", "0")
    assert not all(_crashes(seed, "refund", range(3), 0.35))  # the command itself works
    r = _gate(baseline, env=_env(SIM_CRASH="0.35"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "failed invocations" in r.stdout and "Traceback" not in r.stderr
    assert "sprt         fail" in r.stdout


def test_candidate_command_that_never_runs_is_invalid_input(baseline: Path) -> None:
    r = _gate(baseline, env=_env(SIM_CRASH="1"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "the candidate command failed" in r.stderr and "(last: 7)" in r.stderr
    assert "simulated crash before any run" in r.stderr  # its stderr tail
    assert "Traceback" not in r.stderr and "BLOCK" not in r.stdout


def test_command_not_found_is_invalid_input(baseline: Path) -> None:
    r = _gate(baseline, env=_env(), cmd="pythn-no-such-command agent.py")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "the candidate command failed" in r.stderr and "(last: 127)" in r.stderr
    assert "not found" in r.stderr


def test_too_small_budget_is_inconclusive(baseline: Path, tmp_path: Path) -> None:
    md = tmp_path / "summary.md"
    r = _gate(baseline, "--loop", "--max-runs", "4", "--markdown", str(md), env=_env())
    assert r.returncode == 2 and "planned maximum of 4 runs" in r.stdout
    assert md.exists()


@pytest.mark.slow
def test_usage_errors_exit_3(baseline: Path, tmp_path: Path) -> None:
    both = subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "gate",
                           "--baseline", str(baseline), "--candidate", str(baseline),
                           "--run", "true"], capture_output=True, text=True)
    assert both.returncode == 3 and "exactly one of" in both.stderr
    silent = _gate(baseline, env=_env(), cmd="true")
    assert silent.returncode == 3 and "without sending a run" in silent.stderr
    assert "Traceback" not in silent.stderr
    wrong = _gate(baseline, "--scenario", "nope", env=_env())
    assert wrong.returncode == 3 and "scenario" in wrong.stderr


def _has_children(pid: int) -> bool:
    from pathlib import Path as _P

    tasks = _P(f"/proc/{pid}/task")
    return tasks.exists() and any((t / "children").read_text().strip()
                                  for t in tasks.iterdir() if (t / "children").exists())


@pytest.mark.slow
def test_ctrl_c_ends_inconclusive_without_traceback(baseline: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "assaywatch.monitor.commands.cli", "gate",
                             "--baseline", str(baseline), "--run", CMD, "--theta", "0.5"],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # interrupt once the gate is running candidates (it has a child process), not while the
    # interpreter is still importing on a loaded machine
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _has_children(proc.pid):
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, out + err
    assert "interrupted" in out and "Traceback" not in err


def test_spend_is_reported_beside_fixed_n(baseline: Path, tmp_path: Path) -> None:
    junit = tmp_path / "g.xml"
    r = _gate(baseline, "--loop", "--junit", str(junit), env=_env(SIM_SEED="2"))
    assert r.returncode in (0, 2)
    import xml.etree.ElementTree as ET

    props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    from assaywatch.analyzers.verdicts import sample_size

    b = json.loads(baseline.read_text())["baselines"][0]
    theta = b["passes"] / (b["passes"] + b["fails"])
    assert int(props["spend.fixed_n_runs"]) == sample_size(theta, 0.1, 0.05, 0.1)  # Eq. 6
    assert int(props["spend.runs"]) == _runs(r.stdout)
    assert int(props["spend.tokens"]) > 0
