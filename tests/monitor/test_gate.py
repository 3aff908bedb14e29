"""The pre-deploy gate on simulated agents, end to end through span files written by the
real OTel SDK (OTLP JSON Lines): baseline build, gate decisions and exit codes, outputs."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from assaywatch.analyzers.model import Outcome, Verdict
from assaywatch.analyzers.verdicts import planned_sample_size
from assaywatch.monitor.commands._common import build_baselines
from assaywatch.monitor.commands.cli import main
from assaywatch.monitor.offline.gate import GatePolicy, decide
from assaywatch.monitor.receivers.files import write_otlp_json_lines
from tests.analyzers.simagent import simulate_runs
from tests.e2e.otel_agent import AgentBehaviour, sdk_runs

TOOLS = {"lookup_order": 0.5, "search_kb": 0.3, "refund": 0.2}


def write_spans(path: Path, n: int, behaviour: AgentBehaviour, seed: int,
                scenarios: tuple[str, ...] = ("refund",), version: str = "1.0") -> Path:
    write_otlp_json_lines(str(path), sdk_runs(n, behaviour, seed, version=version,
                                              scenarios=scenarios))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gate")
    base = write_spans(d / "baseline.jsonl.gz", 400, AgentBehaviour(pass_rate=0.9), 1)
    out = {"baseline_spans": base}
    out["baseline"] = d / "baseline.json"
    assert main(["baseline", "build", str(base), "-o", str(out["baseline"])]) == 0
    out["same"] = write_spans(d / "same.jsonl", 400, AgentBehaviour(pass_rate=0.9), 2,
                              version="1.1")
    out["drop"] = write_spans(d / "drop.jsonl", 400, AgentBehaviour(pass_rate=0.75), 3,
                              version="1.1")
    mix = AgentBehaviour(pass_rate=0.9, tools={"lookup_order": 0.1, "search_kb": 0.7,
                                                "refund": 0.2})
    out["mix"] = write_spans(d / "mix.jsonl", 400, mix, 4, version="1.1")
    out["few"] = write_spans(d / "few.jsonl", 15, AgentBehaviour(pass_rate=0.9), 5,
                             version="1.1")
    return out


def gate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["gate", *args])
    return code, capsys.readouterr().out


def test_baseline_file_holds_the_stream(files: dict[str, Path]) -> None:
    doc = json.loads(files["baseline"].read_text())
    assert doc["schema_version"] == 1
    (b,) = doc["baselines"]
    assert b["key"]["agent"] == "support-agent" and b["n_runs"] == 400
    assert sorted(b["tools"]) == sorted(TOOLS)


def test_unchanged_candidate_deploys(files: dict[str, Path], capsys, tmp_path: Path) -> None:
    junit, html, md = tmp_path / "j.xml", tmp_path / "r.html", tmp_path / "s.md"
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["same"]), "--junit", str(junit), "--report", str(html),
                     "--markdown", str(md))
    assert code == 0, out
    assert "DEPLOY" in out
    assert "<testsuite" in junit.read_text() and "plot-pass-rate" in html.read_text()
    assert "deploy" in md.read_text().lower()


def test_pass_rate_drop_blocks(files: dict[str, Path], capsys) -> None:
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["drop"]))
    assert code == 1, out
    assert "pass-rate regression" in out


def test_tool_mix_shift_with_same_pass_rate_asks_for_review(files: dict[str, Path],
                                                             capsys, tmp_path: Path) -> None:
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["mix"]))
    assert code == 2, out
    assert "behaviour shift" in out and "tool:" in out
    cfg = tmp_path / "gate.yaml"
    cfg.write_text("behaviour_shift: block\n")
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["mix"]), "--config", str(cfg))
    assert code == 1, out


def test_fifteen_candidate_runs_are_inconclusive(files: dict[str, Path], capsys) -> None:
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["few"]))
    assert code == 2, out
    assert "inconclusive" in out.lower() and "power" in out


def test_baseline_may_be_span_files(files: dict[str, Path], capsys) -> None:
    code, out = gate(capsys, "--baseline", str(files["baseline_spans"]), "--candidate",
                     str(files["drop"]))
    assert code == 1, out


def test_malformed_file_exits_3_with_file_and_line(files: dict[str, Path],
                                                   tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    good = gzip.open(files["baseline_spans"], "rt").read().splitlines()[0]
    bad.write_text(good + "\n{not json\n" + good + "\n")
    res = subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "gate",
                          "--baseline", str(files["baseline"]), "--candidate", str(bad),
                          "--strict"], capture_output=True, text=True)
    assert res.returncode == 3
    assert f"{bad}:2" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "gate",
                          "--baseline", str(tmp_path / "missing.json"), "--candidate",
                          str(bad)], capture_output=True, text=True)
    assert res.returncode == 3 and "no such file" in res.stderr


def test_bad_gate_config_is_a_usage_error(files: dict[str, Path], tmp_path: Path,
                                          capsys) -> None:
    cfg = tmp_path / "gate.yaml"
    cfg.write_text("alpha: 2\n")
    code = main(["gate", "--baseline", str(files["baseline"]), "--candidate",
                 str(files["same"]), "--config", str(cfg)])
    assert code == 3
    assert "alpha" in capsys.readouterr().err


@pytest.mark.slow
def test_twenty_unchanged_scenarios_deploy_at_least_90_percent() -> None:
    """Holm-Bonferroni over the streams keeps a suite of 20 unchanged scenarios deploying:
    seeded repetitions of the whole decision (no coverage floor). Runs are drawn with
    replacement from one pool of simulated runs of the unchanged agent, so baseline and
    candidate come from the same distribution and the repetitions stay cheap."""
    from dataclasses import replace

    from assaywatch.analyzers.model import StreamKey

    rng = np.random.default_rng(2026)
    pool = simulate_runs(4000, rng, tool_weights=TOOLS)
    policy = GatePolicy()
    # The planned n for a Holm family of 40 tests (20 pass-rate + 20 fingerprint) at the
    # agent's pass rate 0.9: 481 per arm. (This test used 320, chosen by the old Pass rule's
    # power at the *unadjusted* alpha; at 320 an unchanged stream is shown non-inferior
    # with probability ~0.98, so one of 20 is Inconclusive about a third of the time: the
    # design was short, not the gate wrong. See issue 12 and analyzers/verdicts.py.)
    reps, deploys = 30, 0
    n = planned_sample_size(0.9, policy.delta, policy.alpha, policy.beta, tests=40)
    keys = [StreamKey("agent", "1", f"s{i}") for i in range(20)]

    def draw(key: StreamKey) -> list:
        return [replace(pool[i], key=key) for i in rng.integers(0, len(pool), n)]

    for _ in range(reps):
        base_runs, cand_runs = [], []
        for k in keys:
            base_runs += draw(k)
            cand_runs += draw(StreamKey(k.agent, "2", k.scenario))
        report = decide(build_baselines(base_runs), cand_runs, policy)
        deploys += report.decision == "deploy"
    # Holm over the 40 tests bounds the false hold-back rate by alpha = 0.05, so the
    # deploy rate should be >= 0.95 (minus the rare outcome between the Fail and Pass
    # regions at the planned n): require the issue's 90% of the seeded repetitions.
    assert deploys >= 0.9 * reps, deploys


def test_decide_uses_holm_adjusted_p_values() -> None:
    rng = np.random.default_rng(11)
    from assaywatch.analyzers.model import StreamKey

    k1, k2 = StreamKey("a", "1", "x"), StreamKey("a", "1", "y")
    base = build_baselines(simulate_runs(300, rng, key=k1) + simulate_runs(300, rng, key=k2))
    cand = simulate_runs(300, rng, key=k1, pass_rate=0.7) + simulate_runs(300, rng, key=k2)
    report = decide(base, cand, GatePolicy())
    assert report.decision == "block"
    tests = {(s.scenario, t.name): t for s in report.streams for t in s.tests}
    assert tests[("x", "pass_rate")].verdict == Verdict.FAIL.value
    adj = tests[("x", "pass_rate")].statistics
    assert adj["p_value_holm"] >= adj["p_value"]
    assert all(r.outcome in (Outcome.PASS, Outcome.FAIL) for r in cand)
