"""The gate's label test end to end: span files written by the real OTel SDK, whose agent
spans carry a judge's categorical label (``gen_ai.evaluation.score.label``, no score),
through ``assaywatch baseline build`` and ``assaywatch gate`` (exit codes, printed reasons,
JUnit and Markdown), and the decision rule on label shifts (monitor/offline/gate.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.commands._common import build_baselines
from assaywatch.monitor.commands.cli import main
from assaywatch.monitor.offline.gate import GatePolicy, decide
from assaywatch.monitor.receivers.files import write_otlp_json_lines
from tests.analyzers.simagent import simulate_runs
from tests.e2e.otel_agent import AgentBehaviour, emit_run

LABELS = ("correct", "partial", "incorrect")
BEFORE = (0.7, 0.2, 0.1)
AFTER = (0.55, 0.2, 0.25)  # 0.15 of probability moved onto "incorrect"


class _LabellingTracer:
    """The SDK's tracer, putting a judge's label on every agent span it starts (the
    agent's own pass flag stays the run's outcome: it outranks a label)."""

    def __init__(self, tracer: Any, rng: np.random.Generator, probs: tuple[float, ...],
                 labelled: int) -> None:
        self._tracer, self._rng, self._probs, self._left = tracer, rng, probs, labelled

    def start_span(self, name: str, **kwargs: Any) -> Any:
        span = self._tracer.start_span(name, **kwargs)
        if name.startswith("invoke_agent") and self._left > 0:
            self._left -= 1
            span.set_attribute("gen_ai.evaluation.name", "correctness")
            span.set_attribute("gen_ai.evaluation.score.label",
                               str(self._rng.choice(LABELS, p=self._probs)))
        return span


def write_labelled(path: Path, n: int, pass_rate: float, probs: tuple[float, ...],
                   seed: int, version: str, labelled: int | None = None) -> Path:
    """``n`` runs of the simulated agent as OTLP JSON Lines, the first ``labelled`` (all by
    default) labelled by the judge with ``probs`` over :data:`LABELS`."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rng = np.random.default_rng(seed)
    tracer = _LabellingTracer(provider.get_tracer("assaywatch-tests"), rng, probs,
                              n if labelled is None else labelled)
    t = 1_760_000_000_000_000_000
    for _ in range(n):
        t = emit_run(tracer, rng, "support-agent", version, "refund",
                     AgentBehaviour(pass_rate=pass_rate), t) + 1_000_000_000
    provider.shutdown()
    write_otlp_json_lines(str(path), list(exporter.get_finished_spans()))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gate_labels")
    base = write_labelled(d / "baseline.jsonl", 400, 0.9, BEFORE, 1, "1.0")
    out = {"baseline": d / "baseline.json"}
    assert main(["baseline", "build", str(base), "-o", str(out["baseline"])]) == 0
    out["same"] = write_labelled(d / "same.jsonl", 400, 0.9, BEFORE, 2, "1.1")
    out["shifted"] = write_labelled(d / "shifted.jsonl", 400, 0.9, AFTER, 3, "1.1")
    out["drop_shifted"] = write_labelled(d / "drop.jsonl", 400, 0.75, AFTER, 4, "1.1")
    out["unlabelled"] = write_labelled(d / "none.jsonl", 400, 0.9, BEFORE, 5, "1.1",
                                       labelled=0)
    out["few"] = write_labelled(d / "few.jsonl", 400, 0.9, AFTER, 6, "1.1", labelled=6)
    return out


def gate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["gate", *args])
    return code, capsys.readouterr().out


def test_the_baseline_keeps_the_judges_labels(files: dict[str, Path]) -> None:
    import json

    (b,) = json.loads(files["baseline"].read_text())["baselines"]
    counts = b["labels"]["correctness"]["counts"]
    assert sum(counts.values()) == 400 and set(counts) == set(LABELS)
    assert "correctness" not in b.get("evaluators", {})


def test_an_unchanged_labelled_candidate_deploys(files: dict[str, Path], capsys,
                                                 tmp_path: Path) -> None:
    junit, md = tmp_path / "j.xml", tmp_path / "s.md"
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["same"]), "--junit", str(junit), "--markdown", str(md))
    assert code == 0, out
    assert "label:correctness" in out and "no label shift detected" in out
    xml = junit.read_text()
    # the label test is a JUnit case with its numbers as properties
    assert 'name="label:correctness"' in xml and 'name="p_value_holm"' in xml
    assert 'name="gained"' in xml and 'name="n_candidate" value="400"' in xml
    assert "label:correctness" in md.read_text()


def test_a_label_shift_asks_for_review(files: dict[str, Path], capsys,
                                       tmp_path: Path) -> None:
    junit = tmp_path / "j.xml"
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["shifted"]), "--junit", str(junit))
    assert code == 2, out
    decision = out.strip().splitlines()[-1]
    assert decision.startswith("gate: MANUAL (exit 2)")
    assert "label shift" in decision and "correctness" in decision
    assert "'incorrect'" in decision, decision
    assert ("labels of unknown order cannot say worse or better: review" in out)
    assert "pass-rate regression" not in out
    assert "<failure" in junit.read_text()


def test_a_pass_rate_regression_with_a_label_shift_still_blocks(files: dict[str, Path],
                                                                capsys) -> None:
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["drop_shifted"]))
    assert code == 1, out
    assert "pass-rate regression" in out.strip().splitlines()[-1]
    assert "correctness: label shift" in out  # still reported


def test_no_or_too_few_candidate_labels_is_reported_and_does_not_hold_the_gate(
        files: dict[str, Path], capsys) -> None:
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["unlabelled"]))
    assert code == 0, out
    assert "the candidate has no labels of correctness (baseline 400): no label test" in out
    code, out = gate(capsys, "--baseline", str(files["baseline"]), "--candidate",
                     str(files["few"]))
    assert code == 0, out
    assert "only 6 candidate labels of correctness (a test needs 10)" in out


KEY = StreamKey("support-agent", "1.0", "refund")


def _runs(n: int, probs: tuple[float, ...], seed: int, scores: bool = False,
          version: str = "1.0") -> list[Any]:
    rng = np.random.default_rng(seed)
    key = dataclasses.replace(KEY, version=version)
    runs = simulate_runs(n, rng, key=key, tool_weights={"a": 0.5, "b": 0.3, "c": 0.2})
    picks = rng.choice(len(LABELS), size=n, p=probs)
    out = []
    for r, i in zip(runs, picks, strict=True):
        r = dataclasses.replace(r, labels={"correctness": LABELS[i]})
        if scores:
            r.scores = {"correctness": 1.0 if LABELS[i] == "correct" else 0.0}
        out.append(r)
    return out


def test_label_p_values_join_the_holm_family() -> None:
    base = build_baselines(_runs(500, BEFORE, 1))
    report = decide(base, _runs(300, AFTER, 2, version="1.1"), GatePolicy())
    (sr,) = report.streams
    tests = {t.name: t for t in sr.tests}
    lab = tests["label:correctness"]
    # pass rate, fingerprint and the label test: one family of 3
    assert lab.statistics["family_size"] == 3 == tests["pass_rate"].statistics["family_size"]
    assert lab.statistics["p_value_holm"] >= lab.statistics["p_value"]
    assert lab.statistics["gained"] == "incorrect"
    assert lab.verdict == "fail" and report.decision == "manual"


def test_an_evaluator_that_scores_is_tested_by_its_scores_not_its_labels() -> None:
    base = build_baselines(_runs(500, BEFORE, 1, scores=True))
    (b,) = base
    assert "correctness" in b.evaluators and "correctness" not in b.labels
    report = decide(base, _runs(300, BEFORE, 2, scores=True, version="1.1"), GatePolicy())
    names = {t.name for s in report.streams for t in s.tests}
    assert "evaluation:correctness" in names
    assert not any(n.startswith("label:") for n in names)
