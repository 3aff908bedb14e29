r"""Vectorised Monte Carlo of a detector over many independent replicate streams.

The numpy detectors (``BernoulliCUSUM``, ``FingerprintCUSUM``, ``MEWMA``) expose the same
recursion on a batch of R replicates (``_batch_init`` / ``_batch_step``); the tests check
it reproduces ``update`` exactly. Two estimators:

* ``alarm_rate_arl`` runs R streams for T steps, restarting each replicate at its alarms
  as the detector does, and returns R T / (number of alarms). By the renewal theorem this
  converges to the zero-start ARL; for nearly geometric run lengths its relative standard
  error is about 1/sqrt(alarms).
* ``first_alarm_times`` returns each replicate's first alarm time from a fresh start
  (the detection delay when the change is present from the first observation), censored
  at ``max_steps`` (returned as ``max_steps + 1``).

``sample(rng, shape)`` draws observations: ``shape = (chunk, R)`` and it returns an array
of shape ``(chunk, R)`` (scalars) or ``(chunk, R, d)`` (vectors).

Examples
--------
>>> import numpy as np
>>> from assaywatch.analyzers.detectors import BernoulliCUSUM
>>> det = BernoulliCUSUM(0.9, 0.8, arl0=1_000)
>>> t = first_alarm_times(det, lambda g, s: g.random(s) < 0.8, 2_000, 5_000,
...                       np.random.default_rng(3))
>>> bool(55 < t.mean() < 70)  # the Markov chain gives 62.5
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

__all__ = ["BatchDetector", "alarm_rate_arl", "first_alarm_times"]

Sampler = Callable[[np.random.Generator, tuple[int, int]], np.ndarray]


class BatchDetector(Protocol):
    def _batch_init(self, n_replicates: int) -> Any: ...

    def _batch_step(self, state: Any, x: np.ndarray) -> np.ndarray: ...


def alarm_rate_arl(
    detector: BatchDetector,
    sample: Sampler,
    n_replicates: int,
    n_steps: int,
    rng: np.random.Generator,
    chunk: int = 500,
) -> tuple[float, int]:
    """Renewal estimate of the ARL and the number of alarms it rests on."""
    state = detector._batch_init(n_replicates)
    alarms = 0
    done = 0
    while done < n_steps:
        size = min(chunk, n_steps - done)
        xs = sample(rng, (size, n_replicates))
        for x in xs:
            alarms += int(np.count_nonzero(detector._batch_step(state, x)))
        done += size
    arl = n_replicates * n_steps / alarms if alarms else float("inf")
    return arl, alarms


def first_alarm_times(
    detector: BatchDetector,
    sample: Sampler,
    n_replicates: int,
    max_steps: int,
    rng: np.random.Generator,
    chunk: int = 500,
) -> np.ndarray:
    """First alarm time (1-based) of each replicate from a fresh start."""
    state = detector._batch_init(n_replicates)
    times = np.full(n_replicates, max_steps + 1, dtype=np.int64)
    open_ = np.ones(n_replicates, dtype=bool)
    done = 0
    while done < max_steps and open_.any():
        size = min(chunk, max_steps - done)
        xs = sample(rng, (size, n_replicates))
        for i, x in enumerate(xs):
            fired = detector._batch_step(state, x) & open_
            times[fired] = done + i + 1
            open_ &= ~fired
        done += size
    return times
