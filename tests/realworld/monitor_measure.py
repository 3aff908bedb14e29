"""The monitor's guarantees on the realistic world with **learned** baselines (issue 12).

As ``tests/realworld/measure.py`` (same world, same oracle, same result classes), except
that every stream *learns* its baseline inside the engine from its first ``n_b`` runs
(``learn_runs = n_b``), as the monitor does in production: the engine then keeps a
reservoir sample of those runs and calibrates its thresholds on it
(``analyzers/detectors/bootstrap.py``). ``measure.py`` hands the engine a frozen baseline
object instead (a file baseline, calibrated on Gaussian draws).

* :func:`incontrol` -- per stream a fresh learned baseline, then ``horizon`` in-control runs;
  every alarm onset of every detector is recorded (the union).
* :func:`delays` -- per repetition a fresh learned baseline, ``prefix`` in-control runs
  without an alarm (else discarded and counted), then each change on a copy of the engine
  until the first alarm onset (censored at ``max_delay``, counted as ``max_delay + 1``).

Both take their sizes as parameters (bounded time) and a seed; ``workers`` > 1 spreads
streams over processes.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from assaywatch.analyzers.model import Run
from tests.realworld._compat import DetectorConfig, FastEngine
from tests.realworld.measure import (
    DelayResult,
    InControlResult,
    StreamRecord,
    _change,
    _map,
    _runs,
    collect_delays,
    poisson_top_decile,
    warm,
)
from tests.realworld.world import World


def _learned(world: World, i: int, n_b: int, arl0: float, rng: np.random.Generator,
             events: list[Any] | None = None) -> Any:
    """An engine whose stream ``i`` has learned its baseline from ``n_b`` fresh runs."""
    cfg = DetectorConfig(arl0=float(arl0), learn_runs=n_b)
    eng = FastEngine(cfg, on_alarm=None if events is None else events.append)
    for run in _runs(world, i, n_b, rng):
        eng.process(run)
    st = eng.stream(world.key(i))
    assert st is not None and st.baseline is not None and st.baseline.n_runs == n_b
    return eng


def _incontrol_task(args: tuple[World, int, int, int, float, int]) -> StreamRecord:
    world, i, n_b, horizon, arl0, seed = args
    rng = np.random.default_rng([seed, i, n_b, 21])
    events: list[Any] = []
    eng = _learned(world, i, n_b, arl0, rng, events)
    for run in _runs(world, i, horizon, rng):
        eng.process(run)
    st = eng.stream(world.key(i))
    return StreamRecord(i, n_b, horizon, [(e.run_index, e.detector) for e in events],
                        sorted(st.watches), sorted(st.disabled))


def incontrol(world: World, baseline_runs: int, n_streams: int, horizon: int,
              arl0: float = 500.0, seed: int = 12, workers: int = 1) -> InControlResult:
    """In-control alarms of the union, ``n_streams`` streams (scenarios in turn)."""
    warm(world)
    tasks = [(world, i, baseline_runs, horizon, arl0, seed) for i in range(n_streams)]
    res = InControlResult(world.name, baseline_runs, arl0, horizon,
                          _map(_incontrol_task, tasks, workers))
    res.top_decile_reference = poisson_top_decile(
        float(res.counts.mean()), n_streams, np.random.default_rng([seed, 99]))
    return res


def _delay_task(args: tuple[World, int, int, int, int, float, int, tuple[str, ...]]
                ) -> dict[str, tuple[int, str]] | None:
    world, i, n_b, prefix, max_delay, arl0, seed, changes = args
    rng = np.random.default_rng([seed, i, n_b, 22])
    eng = _learned(world, i, n_b, arl0, rng)
    for run in _runs(world, i, prefix, rng):
        if eng.process(run):
            return None  # a false alarm before the change: not steady state
    out: dict[str, tuple[int, str]] = {}
    for name in changes:
        e = copy.deepcopy(eng)
        crng = np.random.default_rng([seed, i, n_b, 23, zlib.crc32(name.encode())])
        delay, det = max_delay + 1, ""
        runs: Iterable[Run] = _runs(world, i, max_delay, crng, _change(name))
        for t, run in enumerate(runs, start=1):
            ev = e.process(run)
            if ev:
                delay, det = t, ev[0].detector
                break
        out[name] = (delay, det)
    return out


def delays(world: World, baseline_runs: int, reps: int,
           changes: Sequence[str] = ("pass_rate", "tool_swap", "latency"),
           prefix: int = 200, max_delay: int = 2_000, arl0: float = 500.0,
           seed: int = 13, workers: int = 1) -> dict[str, DelayResult]:
    """Steady-state detection delays with learned baselines (module docstring)."""
    return collect_delays(_delay_task, world, baseline_runs, reps, changes, prefix,
                          max_delay, arl0, seed, workers)
