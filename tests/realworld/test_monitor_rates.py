"""Issue 12, monitor part: one false-alarm budget per stream on realistic data.

Every test runs the real engine (``tests/realworld/monitor_measure.py``) on the realistic
world with baselines **learned** in the engine, a fresh one per stream, at a configured
``arl0 = 500`` (the production 10,000 would take 20x longer to measure; the claim is
relative to the configured value). Sizes are bounded so the module runs in about a minute
on 2 cores; the figures in the README (analyzers/README.md, "One budget per stream") come
from the larger runs of ``python -m tests.benchmarks detectors``.

How each claim is measured:

* ARL0 of the union: every alarm onset of every detector over ``streams x HORIZON``
  in-control runs; the claim "ARL0 >= arl0" fails when the count of onsets is above the
  0.995 quantile of a Poisson count with mean exposure / arl0 (Monte Carlo error).
* Spread over streams (200-run streams, the worst case): the share of all onsets raised
  by the top decile of streams (the ``round(0.1 * streams)`` with the most) beside its value
  when every stream has the pooled rate (Poisson reference). The rates are not equal: a
  test of equal rates (index of dispersion) passed at this size only for want of alarms,
  and rejects them at p ~ 1e-58 with 20,000 runs a stream (``python -m tests.benchmarks
  decile``, which measures the long-run share with the count noise taken out).
* Delays: steady state (change after 200 in-control runs without an alarm), mean over
  repetitions against the likelihood-ratio CUSUM on the exact per-run LLR calibrated to
  the union's measured ARL0 (``measure.oracle_delay``).
"""

from __future__ import annotations

import math

import pytest
from scipy import stats

from tests.realworld import monitor_measure as mm
from tests.realworld.measure import InControlResult, default_workers, oracle_delay
from tests.realworld.world import realistic_world

pytestmark = pytest.mark.slow  # seeded Monte Carlo, tens of seconds

ARL0 = 500.0
HORIZON = 1_500
STREAMS = {200: 24, 2_000: 8, 10_000: 2}
DELAY_REPS = 8
SEED = 20261213
WORLD = realistic_world()


@pytest.fixture(scope="module")
def incontrol() -> dict[int, InControlResult]:
    return {n_b: mm.incontrol(WORLD, n_b, k, HORIZON, ARL0, seed=SEED,
                              workers=default_workers())
            for n_b, k in STREAMS.items()}


@pytest.mark.parametrize("n_b", sorted(STREAMS))
def test_union_arl0_at_least_the_configured_arl0(incontrol: dict[int, InControlResult],
                                                 n_b: int) -> None:
    res = incontrol[n_b]
    exposure = res.n_streams * res.horizon
    onsets = int(res.counts.sum())
    limit = stats.poisson.ppf(0.995, exposure / ARL0)
    assert onsets <= limit, (n_b, onsets, exposure / ARL0, res.detector_alarms)
    # every alarm is from a detector that has a share of the budget: the SPRT is a verdict
    assert set(res.detector_alarms) <= {"cusum_pass_rate", "cusum_fingerprint"}


#: tool choices correlated within a run (each run its own preferences, Dirichlet with
#: concentration 1) and a per-run load on every latency (sd 0.5 in log): the swap and
#: latency charts' likelihood ratios assume neither, their bootstrap thresholds see both
CORRELATED = realistic_world().with_scenarios(tool_concentration=1.0, latency_run_sigma=0.5)


@pytest.mark.parametrize("n_b, streams", [(200, 24), (2_000, 8)])
def test_union_arl0_holds_when_calls_correlate_within_runs(n_b: int, streams: int) -> None:
    res = mm.incontrol(CORRELATED, n_b, streams, HORIZON, ARL0, seed=SEED + 3,
                       workers=default_workers())
    onsets = int(res.counts.sum())
    limit = stats.poisson.ppf(0.995, streams * HORIZON / ARL0)
    assert onsets <= limit, (n_b, onsets, streams * HORIZON / ARL0, res.detector_alarms)


@pytest.mark.xfail(reason="the streams' rates differ: with 200-run baselines the top decile "
                   "carries 0.28-0.32 of the false alarms in the long run (bench_decile, 40 "
                   "streams x 20,000 runs: naive 0.32, split-half 0.30, gamma fit 0.28, "
                   "95% intervals from 0.22 to 0.36), the pass-rate chart's 0.6 exactly "
                   "(test_bernoulli_cusum.py); at this test's size (about one onset a stream) "
                   "even equal rates give about 0.3. It holds from 500-run baselines on "
                   "(0.17-0.20 at 500, bench_decile)", strict=False)
def test_no_decile_of_streams_carries_more_than_a_quarter_of_false_alarms(
        incontrol: dict[int, InControlResult]) -> None:
    res = incontrol[200]
    assert res.top_decile_share <= 0.25, (res.top_decile_share, res.top_decile_reference)


@pytest.fixture(scope="module")
def delay_ratios(incontrol: dict[int, InControlResult]) -> dict[tuple[int, str], float]:
    out = {}
    for n_b in (200, 2_000):
        target = incontrol[n_b].arl_first
        target = target if math.isfinite(target) else ARL0
        res = mm.delays(WORLD, n_b, DELAY_REPS, seed=SEED + 1, workers=default_workers())
        for change, r in res.items():
            orc = oracle_delay(WORLD, change, target, 200, pool=20_000, seed=SEED + 2,
                               reps=400)
            out[(n_b, change)] = r.mean / orc.delay
    return out


# Measured (analyzers/README.md, 2026-12-05/06): the pass-rate CUSUM 0.9-1.2x the oracle
# at 2,000 runs and 1.3-2.0x at 200, the latency chart on every call's latency 1.2-1.5x at
# 2,000 runs and 1.7-1.95x at 200; the tool swap 1.6-1.9x and 2.15-2.3x: the oracle
# knows which pair of tools swapped and how (one that does not know the pair is 1.2-1.3x
# as slow), the monitor watches every pair and every other change at once.
@pytest.mark.parametrize("n_b, change, bound", [
    pytest.param(2_000, "pass_rate", 1.25, marks=pytest.mark.xfail(
        reason="measured 0.96-1.19x (harness 64 repetitions, benchmark 11, this test's "
        "8: 1.03x), 1.14-1.30x before: at the bound within Monte Carlo error (README)",
        strict=False)),
    pytest.param(2_000, "tool_swap", 1.5, marks=pytest.mark.xfail(
        reason="measured 1.67x (95% interval 1.48-1.87) in 256 repetitions (204 kept), "
        "1.62x in the harness's 64, 1.91x in the benchmark's 64, below 1.5x in this test's 8 "
        "(2026-12-06, with the share ratios' lower bounds; 1.72x, 1.64x and 1.85x before "
        "them): above the bound "
        "(1.89x before the whole-run charts' least threshold went from 8 to 5 nats, 3.0x "
        "before the per-chart levels, 4.8x before the whole-run swap charts). Exact LRs "
        "that do not know the pair need a quarter to a half of the stream's budget for the "
        "whole-run swaps to come within 1.5x (benchmark 'by budget'; the monitor gives them "
        "a twelfth); README", strict=False)),
    (2_000, "latency", 1.5),
    (200, "pass_rate", 2.0),
    pytest.param(200, "tool_swap", 2.0, marks=pytest.mark.xfail(
        reason="measured 2.15x (95% interval 1.90-2.43) in 256 repetitions, 2.32x in the "
        "harness's 64 (2026-12-06, with the share ratios' lower bounds; 2.83x in the "
        "harness before them, 3.0-3.3x before the whole-run charts' least threshold went "
        "from 8 to 5 nats, 6.1-6.6x before the per-chart levels, 16x before the whole-run "
        "swap charts); README",
        strict=False)),
    (200, "latency", 2.0),
])
def test_steady_state_delay_against_the_oracle(delay_ratios: dict[tuple[int, str], float],
                                               n_b: int, change: str, bound: float) -> None:
    assert delay_ratios[(n_b, change)] <= bound, delay_ratios
