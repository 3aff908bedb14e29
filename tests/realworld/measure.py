"""Measurements of today's guarantees on the realistic world (issue 12 groundwork).

Everything runs the **real** monitor engine (through ``tests/realworld/_compat.py``) on runs
of ``tests/realworld/world.py``, over the sampling distribution of learned baselines: every
stream or repetition draws its own fresh baseline of ``n_b`` runs.

(a) :func:`measure_incontrol` -- whole-stream in-control run length to the first alarm of
    the union of all the engine's detectors, at a configured ``arl0`` smaller than the
    production 10,000 (the claim being checked is relative to the configured value).
(b) the same streams, run for a fixed horizon: the share of all false alarms raised by the
    top decile of streams, against the share expected if every stream had the same rate
    (Poisson counts with the same mean).
(c) :func:`measure_delays` -- detection delay in steady state (change after ``prefix``
    in-control runs with no alarm; repetitions with a false alarm in the prefix are
    discarded and counted) against :func:`oracle_delay`: the likelihood-ratio CUSUM on the
    exact per-run LLR of the change (``Batch.llr``), calibrated by simulation to the
    *measured* ARL0 of the union, measured the same way.
(d) gate figures: :func:`gate_suite` and :func:`hotelling_false_positive`.

Every function takes its sizes and repetitions as parameters (bounded time) and a seed;
``workers`` > 1 spreads independent streams over processes (fork).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from assaywatch.analyzers.baseline import BaselineBuilder
from assaywatch.analyzers.fingerprint import fingerprint_matrix
from assaywatch.analyzers.hotelling import hotelling_two_sample
from assaywatch.analyzers.model import Run
from tests.realworld._compat import DetectorConfig, FastEngine, GatePolicy, decide
from tests.realworld.world import Batch, Change, World

F64 = NDArray[np.float64]
CHUNK = 250


# -- plumbing ---------------------------------------------------------------------------
def _map(fn: Callable[[Any], Any], tasks: Sequence[Any], workers: int) -> list[Any]:
    if workers <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(fn, tasks, chunksize=1))


def default_workers() -> int:
    return max(1, min(2, len(os.sched_getaffinity(0))))


def warm(world: World) -> None:
    """Compute the cached pass-rate intercepts before forking workers."""
    for sc in world.scenarios:
        sc.intercept()
        sc.intercept(sc.pass_rate - 0.1)


def _baseline(world: World, i: int, n_b: int, rng: np.random.Generator) -> Any:
    key = world.key(i)
    builder = BaselineBuilder(key)
    done = 0
    while done < n_b:
        k = min(2_000, n_b - done)
        builder.add_many(world.runs(k, rng, scenario=i, key=key))
        done += k
    return builder.freeze()


def _runs(world: World, i: int, n: int, rng: np.random.Generator,
          change: Change | None = None) -> Iterable[Run]:
    key = world.key(i)
    done = 0
    while done < n:
        k = min(CHUNK, n - done)
        yield from world.runs(k, rng, change, scenario=i, key=key)
        done += k


def _engine(baseline: Any, arl0: float, events: list[Any] | None = None) -> Any:
    cfg = DetectorConfig(arl0=float(arl0))
    return FastEngine(cfg, [baseline], on_alarm=None if events is None else events.append)


# -- (a), (b): in-control streams ---------------------------------------------------------
@dataclass
class StreamRecord:
    """Alarm onsets (run index since the baseline froze, detector) of one stream."""

    stream: int
    baseline_runs: int
    horizon: int
    alarms: list[tuple[int, str]]
    detectors: list[str]
    disabled: list[str]

    @property
    def first_alarm(self) -> int | None:
        return self.alarms[0][0] if self.alarms else None


def _incontrol_task(args: tuple[World, int, int, int, float, int]) -> StreamRecord:
    world, i, n_b, horizon, arl0, seed = args
    rng = np.random.default_rng([seed, i, n_b])
    base = _baseline(world, i, n_b, rng)
    events: list[Any] = []
    eng = _engine(base, arl0, events)
    for run in _runs(world, i, horizon, rng):
        eng.process(run)
    st = eng.stream(base.key)
    return StreamRecord(i, n_b, horizon, [(e.run_index, e.detector) for e in events],
                        sorted(st.watches), sorted(st.disabled))


@dataclass
class InControlResult:
    world: str
    baseline_runs: int
    arl0_config: float
    horizon: int
    records: list[StreamRecord]
    #: expected top-decile share if every stream had the pooled alarm rate (Poisson)
    top_decile_reference: float = float("nan")

    @property
    def n_streams(self) -> int:
        return len(self.records)

    @property
    def first_alarms(self) -> NDArray[np.int64]:
        """Run index of each stream's first alarm, ``horizon + 1`` when none (censored)."""
        return np.array([r.first_alarm or r.horizon + 1 for r in self.records])

    @property
    def arl_first(self) -> float:
        """Censored-exponential MLE of the run length to the first alarm of the union:
        exposure (runs watched until the first alarm or the horizon) / first alarms."""
        t = self.first_alarms
        hit = t <= self.horizon
        return float(np.minimum(t, self.horizon).sum() / max(1, int(hit.sum())))

    @property
    def arl_renewal(self) -> float:
        """Runs watched per alarm onset over the whole horizon (onsets after the first
        included; an alarm held active is one onset)."""
        n = sum(len(r.alarms) for r in self.records)
        return self.n_streams * self.horizon / n if n else math.inf

    @property
    def share_before_target(self) -> float:
        """Share of streams whose first alarm came before ``arl0`` runs (a geometric run
        length with mean arl0 gives 1 - 1/e = 0.63)."""
        return float(np.mean(self.first_alarms <= self.arl0_config))

    @property
    def counts(self) -> NDArray[np.int64]:
        return np.array([len(r.alarms) for r in self.records])

    @property
    def top_decile_share(self) -> float:
        return top_decile_share(self.counts)

    @property
    def first_detector(self) -> Counter[str]:
        return Counter(r.alarms[0][1] for r in self.records if r.alarms)

    @property
    def detector_alarms(self) -> Counter[str]:
        return Counter(d for r in self.records for _, d in r.alarms)


def top_decile_share(counts: Sequence[int] | NDArray[np.int64]) -> float:
    """Share of all alarms raised by the 10% of streams with the most (at least one
    stream)."""
    c = np.sort(np.asarray(counts))[::-1]
    total = c.sum()
    if total == 0:
        return float("nan")
    k = max(1, int(round(0.1 * c.size)))
    return float(c[:k].sum() / total)


def poisson_top_decile(mean_count: float, n_streams: int, rng: np.random.Generator,
                       reps: int = 4_000) -> float:
    """Expected top-decile share when every stream's count is Poisson(mean_count)."""
    if mean_count <= 0:
        return float("nan")
    c = np.sort(rng.poisson(mean_count, size=(reps, n_streams)), axis=1)[:, ::-1]
    k = max(1, int(round(0.1 * n_streams)))
    tot = c.sum(axis=1)
    ok = tot > 0
    return float(np.mean(c[ok, :k].sum(axis=1) / tot[ok]))


def measure_incontrol(world: World, baseline_runs: int, n_streams: int, horizon: int,
                      arl0: float = 500.0, seed: int = 12, workers: int = 1) -> InControlResult:
    """(a) and (b) for one baseline size: ``n_streams`` streams (scenarios in turn), each
    with its own fresh baseline, watched in control for ``horizon`` runs."""
    warm(world)
    tasks = [(world, i, baseline_runs, horizon, arl0, seed) for i in range(n_streams)]
    recs = _map(_incontrol_task, tasks, workers)
    res = InControlResult(world.name, baseline_runs, arl0, horizon, recs)
    res.top_decile_reference = poisson_top_decile(
        float(res.counts.mean()), n_streams, np.random.default_rng([seed, 99]))
    return res


# -- (c): detection delays ---------------------------------------------------------------
@dataclass
class DelayResult:
    world: str
    baseline_runs: int
    change: str
    prefix: int
    max_delay: int
    delays: list[int] = field(default_factory=list)
    detectors: Counter[str] = field(default_factory=Counter)
    discarded: int = 0

    @property
    def mean(self) -> float:
        return float(np.mean(self.delays)) if self.delays else float("nan")

    @property
    def censored(self) -> int:
        return sum(d > self.max_delay for d in self.delays)


def _delay_task(args: tuple[World, int, int, int, int, float, int, tuple[str, ...]]
                ) -> dict[str, tuple[int, str]] | None:
    world, i, n_b, prefix, max_delay, arl0, seed, changes = args
    rng = np.random.default_rng([seed, i, n_b, 7])
    base = _baseline(world, i, n_b, rng)
    eng = _engine(base, arl0)
    for run in _runs(world, i, prefix, rng):
        if eng.process(run):
            return None  # a false alarm before the change: not steady state
    out: dict[str, tuple[int, str]] = {}
    for name in changes:
        e = copy.deepcopy(eng)
        crng = np.random.default_rng([seed, i, n_b, 8, zlib.crc32(name.encode())])
        delay, det = max_delay + 1, ""
        for t, run in enumerate(_runs(world, i, max_delay, crng, _change(name)), start=1):
            ev = e.process(run)
            if ev:
                delay, det = t, ev[0].detector
                break
        out[name] = (delay, det)
    return out


def _change(name: str) -> Change:
    from tests.realworld.world import CHANGES

    return CHANGES[name]


def measure_delays(world: World, baseline_runs: int, reps: int,
                   changes: Sequence[str] = ("pass_rate", "tool_swap", "latency"),
                   prefix: int = 200, max_delay: int = 2_000, arl0: float = 500.0,
                   seed: int = 13, workers: int = 1) -> dict[str, DelayResult]:
    """(c), the engine's side: per repetition a fresh baseline (scenario ``rep % k``), then
    ``prefix`` in-control runs, then each change on a copy of the engine until the first
    alarm onset of any detector (censored at ``max_delay``; counted as max_delay + 1)."""
    return collect_delays(_delay_task, world, baseline_runs, reps, changes, prefix,
                          max_delay, arl0, seed, workers)


DelayTask = Callable[[tuple[World, int, int, int, int, float, int, tuple[str, ...]]],
                     "dict[str, tuple[int, str]] | None"]


def collect_delays(task: DelayTask, world: World, baseline_runs: int, reps: int,
                   changes: Sequence[str], prefix: int, max_delay: int, arl0: float,
                   seed: int, workers: int) -> dict[str, DelayResult]:
    """Run ``task`` once per repetition and gather the first-alarm delays per change (a
    repetition that alarmed before the change returns None and is discarded)."""
    warm(world)
    tasks = [(world, i, baseline_runs, prefix, max_delay, arl0, seed, tuple(changes))
             for i in range(reps)]
    outs = _map(task, tasks, workers)
    res = {c: DelayResult(world.name, baseline_runs, c, prefix, max_delay) for c in changes}
    for o in outs:
        for c in changes:
            if o is None:
                res[c].discarded += 1
            else:
                d, det = o[c]
                res[c].delays.append(d)
                res[c].detectors[det or "none"] += 1
    return res


# -- oracle: likelihood-ratio CUSUM on the exact per-run LLR ------------------------------
def _llr_pools(world: World, change: Change, pool: int, rng: np.random.Generator
               ) -> list[tuple[F64, F64]]:
    """(in-control LLRs, changed LLRs) per scenario."""
    out = []
    for i in range(len(world.scenarios)):
        b0 = world.sample(pool, rng, None, scenario=i)
        b1 = world.sample(pool, rng, change, scenario=i)
        out.append((b0.llr(change), b1.llr(change)))
    return out


def lr_cusum_arl(llr0: F64, hs: F64, rng: np.random.Generator, reps: int = 200,
                 steps: int = 20_000, chunk: int = 1_000) -> F64:
    """Renewal ARL of the CUSUM S = max(0, S + llr), alarm and restart at S >= h, for each
    threshold of ``hs`` at once (common random numbers), increments resampled from
    ``llr0``. With ``llr0`` of shape (n, K), K CUSUMs on the columns of the same runs,
    alarming (and all restarting) when any reaches h."""
    hs = np.asarray(hs, dtype=float)
    pool = llr0.reshape(llr0.shape[0], -1)
    s = np.zeros((hs.size, reps, pool.shape[1]))
    alarms = np.zeros(hs.size)
    done = 0
    while done < steps:
        size = min(chunk, steps - done)
        xs = pool[rng.integers(0, pool.shape[0], size=(size, reps))]
        for x in xs:
            s += x
            np.maximum(s, 0.0, out=s)
            fired = (s >= hs[:, None, None]).any(axis=2)
            alarms += fired.sum(axis=1)
            s[fired] = 0.0
        done += size
    with np.errstate(divide="ignore"):
        return reps * steps / alarms


def lr_cusum_threshold(llr0: F64, target: float, rng: np.random.Generator,
                       reps: int = 100, alarms: int = 1_000, max_steps: int = 100_000
                       ) -> float:
    """h giving in-control ARL ``target`` (log-linear interpolation on a grid of 30
    thresholds, simulated together). Steps per replicate: enough for about ``alarms``
    alarms at the target (relative error about 1/sqrt(alarms)), at most ``max_steps``."""
    steps = int(min(max_steps, max(10_000, alarms * target / reps)))
    hs = np.geomspace(0.2, 40.0, 30)
    arl = lr_cusum_arl(llr0, hs, rng, reps, steps)
    ok = np.isfinite(arl)
    la, hh = np.log(arl[ok]), hs[ok]
    # ARL grows with h; the first grid point reaching the target and its predecessor
    j = int(np.searchsorted(la, math.log(target)))
    if j == 0:
        return float(hh[0])
    if j >= la.size:
        return float(hh[-1])
    w = (math.log(target) - la[j - 1]) / (la[j] - la[j - 1])
    return float(hh[j - 1] + w * (hh[j] - hh[j - 1]))


def lr_cusum_delay(llr0: F64, llr1: F64, h: float, prefix: int, rng: np.random.Generator,
                   reps: int = 4_000, max_delay: int = 20_000) -> tuple[float, int]:
    """Steady-state delay (same definition as the engine's: ``prefix`` in-control
    observations with no alarm, then changed ones); returns (mean delay, kept reps).
    ``llr0`` / ``llr1`` of shape (n, K): K CUSUMs, the first to reach h alarms."""
    pool0 = llr0.reshape(llr0.shape[0], -1)
    pool1 = llr1.reshape(llr1.shape[0], -1)
    s = np.zeros((reps, pool0.shape[1]))
    ok = np.ones(reps, dtype=bool)
    for x in pool0[rng.integers(0, pool0.shape[0], size=(prefix, reps))]:
        s = np.maximum(0.0, s + x)
        ok &= (s < h).all(axis=1)
    s, n = s[ok], int(ok.sum())
    delay = np.full(n, max_delay + 1)
    open_ = np.ones(n, dtype=bool)
    t = 0
    while t < max_delay and open_.any():
        size = min(1_000, max_delay - t)
        for x in pool1[rng.integers(0, pool1.shape[0], size=(size, n))]:
            t += 1
            s = np.maximum(0.0, s + x)
            fired = open_ & (s >= h).any(axis=1)
            delay[fired] = t
            open_ &= ~fired
            if not open_.any():
                break
    return float(delay.mean()), n


@dataclass
class OracleResult:
    change: str
    target_arl0: float
    thresholds: list[float]
    arl0_check: list[float]
    delays: list[float]

    @property
    def delay(self) -> float:
        """Mean over scenarios (streams cycle through them equally)."""
        return float(np.mean(self.delays))


def oracle_delay(world: World, change_name: str, target_arl0: float, prefix: int = 200,
                 pool: int = 100_000, seed: int = 14, reps: int = 4_000,
                 check_arl0: bool = False) -> OracleResult:
    """(c), the oracle: per scenario, the LR CUSUM on the exact LLR of the change,
    threshold calibrated by simulation to ``target_arl0`` (the measured ARL0 of the
    union), optionally its ARL0 re-measured on fresh draws, and its steady-state delay."""
    rng = np.random.default_rng([seed, zlib.crc32(change_name.encode())])
    pools = _llr_pools(world, _change(change_name), pool, rng)
    hs, checks, delays = [], [], []
    for llr0, llr1 in pools:
        h = lr_cusum_threshold(llr0, target_arl0, rng)
        check = float(lr_cusum_arl(llr0, np.array([h]), rng, 100, int(min(
            100_000, max(10_000, 1_000 * target_arl0 / 100))))[0]) if check_arl0 else math.nan
        d, _ = lr_cusum_delay(llr0, llr1, h, prefix, rng, reps)
        hs.append(h)
        checks.append(check)
        delays.append(d)
    return OracleResult(change_name, target_arl0, hs, checks, delays)


def _swap_llrs(batch: Batch, change: Change) -> F64:
    """(n, K) exact per-run LLRs of ``change`` (a tool swap) moved to every ordered pair of
    the scenario's tools (:meth:`Batch.llr` with the scenario's ``swap`` replaced)."""
    sc = batch.scenario
    pairs = [(a, b) for a in sc.tool_names for b in sc.tool_names if a != b]
    return np.stack([dataclasses.replace(batch, scenario=dataclasses.replace(sc, swap=p))
                     .llr(change) for p in pairs], axis=1)


def pair_unknown_swap_oracle(world: World, target_arl0: float, prefix: int = 200,
                             pool: int = 20_000, seed: int = 15, reps: int = 1_000
                             ) -> OracleResult:
    """The tool swap's oracle that does not know **which** pair swaps: per scenario, one LR
    CUSUM per ordered pair of its tools on the exact LLR of that pair's whole-run swap at
    the scenario's share, an alarm when any reaches a common h, calibrated by simulation
    to ``target_arl0``. It knows the shape (whole runs, the share) and the call shares: the
    price of not knowing the pair, and nothing else, over :func:`oracle_delay`."""
    change = _change("tool_swap")
    rng = np.random.default_rng([seed, 1])
    hs, delays = [], []
    for i in range(len(world.scenarios)):
        l0 = _swap_llrs(world.sample(pool, rng, None, scenario=i), change)
        l1 = _swap_llrs(world.sample(pool, rng, change, scenario=i), change)
        h = lr_cusum_threshold(l0, target_arl0, rng)
        d, _ = lr_cusum_delay(l0, l1, h, prefix, rng, reps)
        hs.append(h)
        delays.append(d)
    return OracleResult("tool_swap (pair unknown)", target_arl0, hs,
                        [math.nan] * len(hs), delays)


# -- (d): gate figures ---------------------------------------------------------------------
class RunPool:
    """Pre-generated runs per (scenario, change), drawn without replacement per repetition
    (a pool much larger than a draw makes this close to fresh sampling, at a fraction of
    the cost)."""

    def __init__(self, world: World, size: int, rng: np.random.Generator,
                 changes: Iterable[str | None] = (None,)) -> None:
        self.world = world
        self.runs: dict[tuple[int, str | None], list[Run]] = {}
        for c in changes:
            for i in range(len(world.scenarios)):
                ch = None if c is None else _change(c)
                self.runs[(i, c)] = world.runs(size, rng, ch, scenario=i)

    def draw(self, stream: int, n: int, rng: np.random.Generator, change: str | None = None,
             exclude: set[int] | None = None) -> tuple[list[Run], set[int]]:
        k = len(self.world.scenarios)
        pool = self.runs[(stream % k, change)]
        idx = rng.choice(len(pool), size=n + (len(exclude) if exclude else 0), replace=False)
        if exclude:
            idx = np.array([j for j in idx if j not in exclude][:n])
        key = self.world.key(stream)
        return [dataclasses.replace(pool[j], key=key) for j in idx], set(idx.tolist())


@dataclass
class GateResult:
    label: str
    reps: int
    decisions: Counter[str]
    fingerprint_fail: int

    def p(self, decision: str) -> float:
        return self.decisions[decision] / self.reps


def gate_suite(world: World, pool: RunPool, n_streams: int, n_baseline: int,
               n_candidate: int, regressed: int, reps: int, seed: int = 15,
               label: str = "", policy: Any = None, workers: int = 1) -> GateResult:
    """The gate's decision (``decide``) on ``n_streams`` streams (scenarios in turn), each
    with a baseline of ``n_baseline`` and a candidate of ``n_candidate`` runs; the first
    ``regressed`` candidates come from the pass-rate change (a drop of exactly delta)."""
    parts = max(1, min(workers, reps))
    tasks = [(world, pool, n_streams, n_baseline, n_candidate, regressed,
              reps // parts + (j < reps % parts), seed * 1_000 + j, policy)
             for j in range(parts)]
    outs = _map(_gate_task, tasks, parts)
    decisions: Counter[str] = Counter()
    for d, _ in outs:
        decisions.update(d)
    return GateResult(label, reps, decisions, sum(f for _, f in outs))


def _gate_task(args: tuple[Any, ...]) -> tuple[Counter[str], int]:
    world, pool, n_streams, n_baseline, n_candidate, regressed, reps, seed, policy = args
    policy = policy or GatePolicy()
    rng = np.random.default_rng([seed, n_streams, n_baseline, n_candidate, regressed])
    decisions: Counter[str] = Counter()
    fp_fail = 0
    for _ in range(reps):
        baselines, cand = [], []
        for s in range(n_streams):
            b_runs, used = pool.draw(s, n_baseline, rng)
            if s < regressed:
                c_runs, _ = pool.draw(s, n_candidate, rng, "pass_rate")
            else:
                c_runs, _ = pool.draw(s, n_candidate, rng, exclude=used)
            builder = BaselineBuilder(world.key(s))
            builder.add_many(b_runs)
            baselines.append(builder.freeze())
            cand.extend(c_runs)
        rep = decide(baselines, cand, policy)
        decisions[rep.decision] += 1
        fp_fail += any(t.name == "fingerprint" and t.verdict == "fail"
                       for s in rep.streams for t in s.tests)
    return decisions, fp_fail


def fingerprint_pool(world: World, size: int, rng: np.random.Generator) -> list[F64]:
    """In-control fingerprints, ``size`` per scenario (columns: the scenario's tools)."""
    return [fingerprint_matrix(world.runs(size, rng, scenario=i),
                               sorted(world.scenario(i).tool_names))
            for i in range(len(world.scenarios))]


def hotelling_false_positive(pools: Sequence[F64], n_baseline: int, n_candidate: int,
                             alpha: float, reps: int, per_baseline: int = 25,
                             seed: int = 16) -> tuple[float, int]:
    """Rejection rate of ``hotelling_two_sample`` at ``alpha`` on unchanged data: a
    baseline of ``n_baseline`` and candidates of ``n_candidate`` runs drawn without
    replacement from one pool of in-control fingerprints (pools in turn); a fresh baseline
    every ``per_baseline`` candidates. Returns (rate, rejections)."""
    rng = np.random.default_rng([seed, n_baseline, n_candidate])
    rejections = done = b = 0
    while done < reps:
        x = pools[b % len(pools)]
        idx = rng.permutation(x.shape[0])
        xb = x[idx[:n_baseline]]
        rest = idx[n_baseline:]
        mean, cov = xb.mean(axis=0), np.cov(xb, rowvar=False, ddof=1)
        for j in range(min(per_baseline, reps - done, rest.size // n_candidate)):
            xc = x[rest[j * n_candidate:(j + 1) * n_candidate]]
            res = hotelling_two_sample(mean, cov, n_baseline, xc, alpha=alpha)
            rejections += bool(res.reject)
            done += 1
        b += 1
    return rejections / reps, rejections
