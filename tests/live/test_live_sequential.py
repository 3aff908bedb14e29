"""The live gate's sequential decision at the statistics level (seeded, vectorised).

The real subprocess path is exercised in test_live_gate.py a few times; error rates over
many repetitions are measured here with :func:`simulate`, which is checked to make exactly
the decisions :class:`StreamTest` makes on the same draws.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from assaywatch.analyzers.baseline import Baseline, build_baseline
from assaywatch.analyzers.fingerprint import fingerprint_matrix
from assaywatch.analyzers.model import StreamKey, Verdict
from assaywatch.analyzers.sprt_operating import sprt_exact
from assaywatch.analyzers.verdicts import sample_size
from assaywatch.monitor.live.sequential import (
    LiveConfig,
    StreamTest,
    horizon_arl0,
    simulate,
)
from tests.analyzers.simagent import simulate_runs

KEY = StreamKey("support-agent", "1.0", "refund")


def _baseline(passes: int, n: int, fps: np.ndarray, tools: tuple[str, ...],
              version: str = "1.0") -> Baseline:
    from assaywatch.analyzers.fingerprint import feature_names

    return Baseline(key=StreamKey(KEY.agent, version, KEY.scenario), n_runs=len(fps),
                    passes=passes, fails=n - passes, unknown=0, tools=tools,
                    tool_inventory_source="observed", feature_names=tuple(feature_names(tools)),
                    mean=fps.mean(axis=0), cov=np.cov(fps, rowvar=False))


@pytest.fixture(scope="module")
def pools() -> dict[str, np.ndarray]:
    """Fingerprints of realistic simulated runs (skewed tokens and latencies)."""
    rng = np.random.default_rng(20261201)
    base_runs = simulate_runs(300, rng)
    tools = build_baseline(base_runs).tools
    same = fingerprint_matrix(simulate_runs(1500, rng), tools)
    mix = fingerprint_matrix(simulate_runs(600, rng, tool_weights={
        "search": 0.5, "calc": 0.5}), tools)  # lookup swapped for calc, same call counts
    return {"baseline": fingerprint_matrix(base_runs, tools), "same": same, "mix": mix,
            "tools": np.array(tools)}


def _test(pools: dict[str, np.ndarray], cfg: LiveConfig, passes: int = 270,
          version: str = "1.0") -> StreamTest:
    base = _baseline(passes, 300, pools["baseline"], tuple(pools["tools"]), version)
    return StreamTest(base, cfg, candidate_version="1.0")


def _sampler(p: float, pool: np.ndarray):
    def sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.random(n) < p, pool[rng.integers(0, len(pool), n)]

    return sample


def test_simulate_makes_the_scalar_tests_decisions(pools: dict[str, np.ndarray]) -> None:
    cfg = LiveConfig()
    template = _test(pools, cfg)
    rng = np.random.default_rng(5)
    reps, horizon = 40, template.n_plan
    # Half the replicates regress in pass rate, a quarter in tool mix: every stop kind occurs.
    p = np.where(np.arange(reps) < reps // 2, 0.9, 0.75)
    outcomes = rng.random((horizon, reps)) < p
    pool_idx = rng.integers(0, 600, (horizon, reps))
    use_mix = np.arange(reps) % 4 == 3
    fps = np.where(use_mix[None, :, None], pools["mix"][pool_idx], pools["same"][pool_idx])
    step = iter(range(horizon))

    def replay(_rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        t = next(step)
        return outcomes[t], fps[t]

    sim = simulate(template, replay, reps, rng)
    for r in range(reps):
        t = _test(pools, cfg)
        i = 0
        while not t.done:
            t.update(bool(outcomes[i, r]), fps[i, r])
            i += 1
        want = {Verdict.FAIL: 1, Verdict.PASS: -1, None: 0}[t.sprt_decision]
        assert (sim.sprt[r], bool(sim.alarm[r]), sim.n[r]) == (want, t.alarm_at is not None,
                                                               t.n_runs), r
    assert {int(v) for v in sim.sprt} >= {1, -1} and sim.alarm.any()


def test_warm_start_never_decides_alone_and_is_capped(pools: dict[str, np.ndarray]) -> None:
    same = _test(pools, LiveConfig())
    other = _test(pools, LiveConfig(), version="0.9")
    cold = _test(pools, LiveConfig(warm_start=False))
    a, b = same.bounds
    assert a < same.llr0 < 0 and cold.llr0 == 0.0
    # SPEC 7.5 cap at inflation 1.5: |Lambda_0| <= ln(1.5 (1 - alpha)) on the Pass side.
    assert same.llr0 >= -math.log(1.5 * 0.95) - 1e-12
    assert same.same_version and not other.same_version
    assert other.llr0 >= same.llr0  # other-version runs are discounted: never a larger start


def test_cold_sprt_matches_the_exact_operating_characteristic(
        pools: dict[str, np.ndarray]) -> None:
    """Fingerprint off, cold start: the simulation must agree with sprt_exact's closed form."""
    cfg = LiveConfig(warm_start=False, fingerprint=False)
    t = _test(pools, cfg)
    rng = np.random.default_rng(11)
    n_rep = 4000
    for p in (t.theta, t.theta - cfg.delta):
        sim = simulate(t, _sampler(p, pools["same"]), n_rep, rng)
        exact = sprt_exact(t.theta, cfg.delta, cfg.alpha, cfg.beta, p, n_max=t.n_plan)
        se = math.sqrt(exact.fail * (1 - exact.fail) / n_rep)
        assert abs(sim.fail_rate - exact.fail) < 4 * se  # 4 SE: a false failure ~ 6e-5
        assert abs(sim.n.mean() - exact.mean_n) < 4 * sim.n.std() / math.sqrt(n_rep)


@pytest.mark.parametrize("warm", [False, True])
def test_type_one_power_and_runs_within_spec_bounds(pools: dict[str, np.ndarray],
                                                    warm: bool) -> None:
    """SPEC 7.5: Type I <= 1.5 alpha, power >= 1 - 1.5 beta, with both tests on; and the
    mean runs spent is far below the fixed-n design of Eq. 6."""
    cfg = LiveConfig(warm_start=warm)
    t = _test(pools, cfg)
    rng = np.random.default_rng(7 + warm)
    n_rep = 3000
    null = simulate(t, _sampler(t.theta, pools["same"]), n_rep, rng)
    alt = simulate(t, _sampler(t.theta - cfg.delta, pools["same"]), n_rep, rng)
    # Tolerance: 3 binomial SE at the bound itself (0.075: SE 0.0048; 0.85: SE 0.0065).
    assert null.fail_rate <= 1.5 * cfg.alpha + 3 * math.sqrt(0.075 * 0.925 / n_rep)
    assert alt.fail_rate >= 1 - 1.5 * cfg.beta - 3 * math.sqrt(0.85 * 0.15 / n_rep)
    fixed = sample_size(t.theta, cfg.delta, cfg.alpha, cfg.beta)
    assert null.n.mean() < fixed / 2.5 and alt.n.mean() < fixed / 2.5


def test_fingerprint_false_alarms_stay_within_alpha_over_the_horizon(
        pools: dict[str, np.ndarray]) -> None:
    """ARL0 = n / -ln(1 - alpha): at most alpha_fp false alarms within the whole n_plan
    horizon (the SPRT would usually stop earlier; this is the worst case), on skewed
    simulated fingerprints of the baseline's own behaviour."""
    cfg = LiveConfig(fingerprint_alpha=0.05)
    t = _test(pools, cfg)
    det = t.detector
    assert det is not None
    rng = np.random.default_rng(3)
    n_rep, horizon = 2000, t.n_plan
    state = det._batch_init(n_rep)
    alarmed = np.zeros(n_rep, dtype=bool)
    pool = pools["same"]
    for _ in range(horizon):
        alarmed |= det._batch_step(state, pool[rng.integers(0, len(pool), n_rep)])
    # The baseline (300 runs) is an estimate: allow 3 SE above alpha (SE 0.0049).
    assert alarmed.mean() <= cfg.fingerprint_alpha + 3 * math.sqrt(0.05 * 0.95 / n_rep)
    assert math.isclose(horizon_arl0(horizon, 0.05), horizon / 0.05129329, rel_tol=1e-6)


def test_tool_mix_change_is_caught_long_before_any_pass_rate_decision(
        pools: dict[str, np.ndarray]) -> None:
    cfg = LiveConfig()
    t = _test(pools, cfg)
    rng = np.random.default_rng(9)
    sim = simulate(t, _sampler(t.theta, pools["mix"]), 1000, rng)
    # Stopping at the first decision, the alarm races the SPRT's Pass (>= 17 runs here).
    assert sim.alarm_rate > 0.6
    pass_only = simulate(_test(pools, LiveConfig(fingerprint=False)),
                         _sampler(t.theta, pools["mix"]), 1000, rng)
    # The pass-rate test cannot see the change at all: it passes (rightly, for its H0)
    # and fails no more often than alpha allows (3 SE of a 1000-replicate rate).
    assert pass_only.pass_rate > 0.85 and pass_only.fail_rate < 0.05 + 3 * 0.0069
    assert sim.n[sim.alarm].mean() < pass_only.n.mean() / 2
    # Over the planned horizon the swap is (almost) always caught, and early.
    det = t.detector
    assert det is not None
    state, first = det._batch_init(1000), np.zeros(1000, dtype=np.int64)
    for i in range(t.n_plan):
        fired = det._batch_step(state, pools["mix"][rng.integers(0, len(pools["mix"]), 1000)])
        first[(first == 0) & fired] = i + 1
    assert np.mean(first > 0) > 0.99 and first[first > 0].mean() < pass_only.n.mean()


def test_bonferroni_split_over_streams(pools: dict[str, np.ndarray]) -> None:
    one, two = _test(pools, LiveConfig()), _test(pools, LiveConfig(n_streams=2))
    assert two.alpha == one.alpha / 2 and two.fingerprint_alpha == one.fingerprint_alpha / 2
    assert two.sprt.upper > one.sprt.upper and two.n_fixed > one.n_fixed


def test_planned_maximum_truncates_inconclusive(pools: dict[str, np.ndarray]) -> None:
    t = _test(pools, LiveConfig(n_max=5))
    assert t.n_plan == 5
    for _ in range(5):
        t.update(True, pools["same"][0])
    assert t.done and t.stopped_by == "planned_maximum"
    assert t.sprt_verdict()[0] is Verdict.INCONCLUSIVE
    t.update(True, pools["same"][0])
    assert t.ignored == 1 and t.n_runs == 5
