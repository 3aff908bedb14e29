"""The latency chart (``analyzers/detectors/latency.py``): per-kind sums, the model fitted
from them, the per-run likelihood ratio, and the chart inside the multichart CUSUM."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from assaywatch.analyzers.detectors import latency
from assaywatch.analyzers.detectors.bootstrap import (
    BaselineData,
    CalibrationSettings,
    calibrate,
)
from assaywatch.analyzers.detectors.multichart import MultichartCUSUM
from assaywatch.analyzers.model import Action, Run, Step, StreamKey

KEY = StreamKey("agent", "1", "s")
# the law of the synthetic runs: llm latency exp(-1 + 0.3 log1p(tokens) + N(0, 0.4^2)),
# tool "search" latency exp(log 0.5 + N(0, 0.8^2)), 1-6 rounds of (search, llm)
LLM_A, LLM_B, LLM_SD = -1.0, 0.3, 0.4
TOOL_A, TOOL_SD = math.log(0.5), 0.8


def _run(rng: np.random.Generator, factor: float = 1.0) -> Run:
    steps = []
    for _ in range(int(rng.integers(1, 7))):
        steps.append(Step(Action.TOOL, tool="search",
                          latency_s=factor * math.exp(TOOL_A + TOOL_SD * rng.normal())))
        tokens = int(rng.integers(200, 5_000))
        mu = LLM_A + LLM_B * math.log1p(tokens)
        steps.append(Step(Action.LLM, input_tokens=tokens,
                          latency_s=factor * math.exp(mu + LLM_SD * rng.normal())))
    return Run("t", str(rng.integers(1 << 60)), KEY, steps)


def test_run_stats_are_the_per_kind_sums() -> None:
    steps = [Step(Action.LLM, latency_s=math.e, input_tokens=0),
             Step(Action.LLM, latency_s=1.0, input_tokens=int(math.e ** 2) - 1),
             Step(Action.TOOL, tool="a", latency_s=math.e ** 2),
             Step(Action.TOOL, tool="a", latency_s=0.0),        # no latency: left out
             Step(Action.HANDOFF, tool="b", latency_s=5.0),     # not a timed call
             Step(Action.RETRIEVE, latency_s=1.0)]
    s = latency.run_stats(Run("t", "r", KEY, steps))
    assert sorted(s) == ["llm", "retrieve", "tool:a"]
    t2 = math.log(int(math.e ** 2))  # log1p(int(e^2) - 1)
    assert s["llm"] == pytest.approx([2.0, 1.0, 1.0, t2, t2 * t2, 0.0])
    assert s["tool:a"] == pytest.approx([1.0, 2.0, 4.0, 0.0, 0.0, 0.0])
    assert s["retrieve"] == pytest.approx([1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    v = latency.stats_vector(s, ["tool:a", "nothing", "llm"])
    assert v.tolist()[:6] == pytest.approx(s["tool:a"]) and not v[6:12].any()


def test_fit_recovers_the_latency_law_and_the_token_slope() -> None:
    rng = np.random.default_rng(1)
    runs = [latency.run_stats(_run(rng)) for _ in range(3_000)]
    known = ["tool:search", "llm"]
    kinds = latency.choose_kinds(known, np.array([latency.stats_vector(s, known)
                                                   for s in runs]))
    assert kinds == ["llm", "tool:search"]
    params = latency.fit(np.array([latency.stats_vector(s, kinds) for s in runs]))
    (a, b, var), (ta, tb, tvar) = params
    assert a == pytest.approx(LLM_A, abs=0.1) and b == pytest.approx(LLM_B, abs=0.015)
    assert math.sqrt(var) == pytest.approx(LLM_SD, rel=0.03)
    assert (ta, tb) == (pytest.approx(TOOL_A, abs=0.03), 0.0)
    assert math.sqrt(tvar) == pytest.approx(TOOL_SD, rel=0.03)


def test_llr_is_the_sum_of_the_calls_normal_log_density_ratios() -> None:
    rng = np.random.default_rng(2)
    params = np.array([[LLM_A, LLM_B, LLM_SD ** 2], [TOOL_A, 0.0, TOOL_SD ** 2]])
    theta = math.log(1.25)
    for _ in range(5):
        run = _run(rng, factor=1.1)
        want = 0.0
        for st in run.steps:
            x = math.log(st.latency_s)
            mu, sd = ((LLM_A + LLM_B * math.log1p(st.input_tokens), LLM_SD)
                      if st.action == Action.LLM else (TOOL_A, TOOL_SD))
            want += stats.norm.logpdf(x, mu + theta, sd) - stats.norm.logpdf(x, mu, sd)
        v = latency.stats_vector(latency.run_stats(run), ["llm", "tool:search"])
        assert float(latency.llr(v, params, theta)) == pytest.approx(want, abs=1e-9)
        assert float(latency.llr(v, params, theta, bound=0.5)) == pytest.approx(
            max(-0.5, min(0.5, want)))


def _calibrated(n: int = 1_000, seed: int = 3) -> tuple[MultichartCUSUM, float]:
    """A multichart with a latency chart, calibrated by the bootstrap on n runs."""
    rng = np.random.default_rng(seed)
    runs = [_run(rng) for _ in range(n)]
    lat = [latency.run_stats(r) for r in runs]
    kinds = latency.choose_kinds(["llm", "tool:search"], np.array(
        [latency.stats_vector(s, ["llm", "tool:search"]) for s in lat]))
    x = rng.standard_normal((n, 2))  # a two-feature stand-in for the fingerprints
    data = BaselineData(x.mean(0), np.cov(x, rowvar=False), n, 0, 0, x,
                        latency_kinds=kinds,
                        latency_sample=np.array([latency.stats_vector(s, kinds) for s in lat]))
    th = calibrate(data, CalibrationSettings(arl0=1_000, shares={"cusum_fingerprint": 1.0}),
                   seed=seed)
    assert th.latency is not None and th.latency[0] == ("llm", "tool:search")
    assert th.fingerprint is not None
    det = MultichartCUSUM(data.mean, data.cov, k=0.25, h=th.fingerprint,
                          latency=th.latency)
    assert det.labels[-1] == "latency" and det.input_size == 2 + 2 * latency.N_STATS
    # one run never alarms on its own: the threshold is at least the clip of its LR
    assert np.all(th.fingerprint[:, -1] >= det.count_clip)
    return det, float(th.fingerprint[0, -1])


def _first_alarm(det: MultichartCUSUM, factor: float, n: int, seed: int) -> tuple[int, str]:
    rng = np.random.default_rng(seed)
    for t in range(1, n + 1):
        run = _run(rng, factor)
        v = latency.stats_vector(latency.run_stats(run), det.latency_kinds)
        det.update(np.concatenate([rng.standard_normal(2), v]))
        if det.drift_detected:
            return t, ",".join(det.charts_alarmed)
    return n + 1, ""


def test_the_latency_chart_finds_a_slowdown_and_a_speedup_and_is_quiet_in_control() -> None:
    det, _ = _calibrated()
    # 1.3x slower: per run (~3.5 rounds of one llm and one tool call) the LR's mean is
    # about 3.5 (0.069/0.32 + 0.069/1.28) ~ 0.9 nats, so a threshold of ~10 nats is
    # crossed within a few dozen runs
    t_up, charts_up = _first_alarm(det, 1.3, 200, seed=10)
    assert t_up <= 60 and "latency:up" in charts_up
    det._reset()
    t_down, charts_down = _first_alarm(det, 1 / 1.3, 200, seed=11)
    assert t_down <= 60 and "latency:down" in charts_down
    det._reset()
    # in control: the whole chart set is calibrated to ARL0 1,000; 300 runs alarm with
    # probability about 0.26 at most (P(alarm in 300) <= 300/1000 for a renewal process)
    # on average; the latency chart's share of that is below its part: check that its
    # statistic stays well below the threshold over 300 in-control runs of three seeds
    alarms = sum(_first_alarm(det, 1.0, 300, seed=s)[1].count("latency") for s in (12, 13, 14))
    assert alarms == 0


def test_a_multichart_without_latency_model_reads_the_fingerprint_alone() -> None:
    det = MultichartCUSUM(np.zeros(2), np.eye(2))
    assert det.latency_kinds == () and det.input_size == 2
    with pytest.raises(ValueError, match="2 finite numbers"):
        det.update(np.zeros(3))
    with pytest.raises(ValueError, match="sigma"):
        MultichartCUSUM(np.zeros(2), np.eye(2), latency=(["llm"], np.array([[0.0, 0.0, 0.0]])))


def test_kinds_need_enough_calls_and_a_latency_above_the_hosts_scheduling() -> None:
    def run(tool: str, latency_s: float, calls: int) -> dict[str, list[float]]:
        steps = [Step(Action.TOOL, tool=tool, latency_s=latency_s) for _ in range(calls)]
        return latency.run_stats(Run("t", "r", KEY, steps))

    sample = ([run("slow", 0.2, 3)] * 10          # 30 calls of 200 ms: charted
              + [run("rare", 0.2, 1)] * 29        # 29 calls: too few to know its law
              + [run("local", 0.002, 5)] * 20)    # 100 calls of 2 ms: the host's noise
    known = ["tool:local", "tool:rare", "tool:slow"]
    rows = np.array([latency.stats_vector(s, known) for s in sample])
    assert latency.choose_kinds(known, rows) == ["tool:slow"]
    # runs without any timed call (no llm, tool or retrieve step with a latency)
    assert latency.choose_kinds([], np.zeros((5, 0))) == []
