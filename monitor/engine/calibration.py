"""Calibration off the hot path: the job a baseline freeze submits, the worker that runs it,
and the cache of calibrated thresholds.

A stream's baseline freezes inside ``Engine.process`` (under the pipeline lock); its
thresholds come from :func:`~assaywatch.analyzers.detectors.bootstrap.calibrate`, a pure
function of the baseline's numbers, a sample of its runs, the settings and a seed derived
from the baseline id (0.05-0.3 s). With a :class:`CalibrationWorker` the engine submits a
:class:`CalibrationJob` (a small picklable payload) to a process pool and keeps ingesting:
the stream's runs are buffered, in order, and fed to its detectors as soon as the
thresholds arrive, so the alarms and their run indices are those of an inline calibration.
Without a worker (``assaywatch replay``, tests) the job runs inline, as before.

Why processes: the bootstrap is numpy over small arrays, so it holds the GIL for much of
its time; a calibration thread cut the pipeline thread's rate to 52-76% on 2 cores, a
process pool to 78-99% (measured while the machine was shared, see README "Freezing").
The pool uses the ``forkserver`` start method: the monitor runs gRPC and HTTP threads, and
``fork`` of a threaded process is unsafe.

Results are cached by their sufficient inputs (:func:`cache_key`: the baseline id, where
the calibration sample came from, and every setting that enters ``calibrate``); the cache
is part of the engine's checkpoint, so a restart never calibrates a baseline again (a new
version of an agent starts from its predecessor's thresholds after a restart too). The
pass-rate threshold, the larger part of a calibration, is cached inside ``bootstrap`` by
its own exact key (passes, fails, delta, ARL0 share, confidence) in each worker process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from assaywatch.analyzers.detectors.bootstrap import (
    BaselineData,
    CalibrationSettings,
    Thresholds,
    calibrate,
)

logger = logging.getLogger(__name__)

#: Calibration worker processes when not given: one less than the cores this process may
#: use (the pipeline thread keeps one), at least 1, at most 4.
DEFAULT_WORKERS: int | None = None
#: Thresholds kept in the engine's cache (least recently used dropped first); a stream's
#: own thresholds stay on its state, so an evicted entry only costs a later recalibration
#: of a new version of that agent.
CACHE_ENTRIES = 10_000


@dataclass(frozen=True)
class CalibrationJob:
    """Everything :func:`run_job` needs: picklable, a few hundred kilobytes at most (the
    sample is at most ``calibration_runs`` rows of the baseline's features)."""

    key: Hashable
    data: BaselineData
    settings: CalibrationSettings
    seed: int
    label: str = ""


def run_job(job: CalibrationJob) -> Thresholds:
    """The calibration itself (in a worker process or inline): never raises for a
    baseline the detectors cannot use, it says why in ``Thresholds.disabled``."""
    try:
        return calibrate(job.data, job.settings, job.seed)
    except (ValueError, np.linalg.LinAlgError) as exc:
        logger.warning("%s: calibration failed: %s", job.label, exc)
        return Thresholds(None, None, disabled={"cusum_fingerprint": str(exc)})


def cache_key(baseline_id: str, source: str, settings: CalibrationSettings,
              sample_rows: int) -> tuple[object, ...]:
    """The inputs that determine a calibration: the baseline (its id hashes its numbers),
    where its sample came from (``learned``: the reservoir of its own runs, which the id
    determines given ``sample_rows``; ``given``; ``gaussian``) and the settings."""
    s = settings
    return (baseline_id, source, sample_rows, float(s.arl0), float(s.confidence),
            tuple(sorted((k, float(v)) for k, v in s.shares.items())), float(s.k),
            float(s.delta), int(s.reps), float(s.clip), float(s.score_shift),
            float(s.tool_shift), float(s.latency_factor))


class ThresholdCache:
    """Calibrated thresholds by :func:`cache_key`, least recently used dropped past
    ``CACHE_ENTRIES``; picklable (it travels with the engine's checkpoint)."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self._d: OrderedDict[Hashable, Thresholds] = OrderedDict()

    def get(self, key: Hashable) -> Thresholds | None:
        th = self._d.get(key)
        if th is not None:
            self._d.move_to_end(key)
        return th

    def put(self, key: Hashable, th: Thresholds) -> None:
        self._d[key] = th
        self._d.move_to_end(key)
        while len(self._d) > self.entries:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)

    def items(self) -> list[tuple[Hashable, Thresholds]]:
        return list(self._d.items())


def default_workers() -> int:
    if DEFAULT_WORKERS is not None:
        return DEFAULT_WORKERS
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(4, cores - 1))


#: Niceness added to the calibration worker processes: calibration is background work,
#: so on a machine with fewer free cores than busy threads the pipeline keeps its share
#: and the calibrations take longer (monitor/README.md "Freezing never stalls ingestion").
WORKER_NICE = 10


def _lower_priority() -> None:
    try:
        os.nice(WORKER_NICE)
    except OSError:  # not permitted here: run at the monitor's priority
        pass


def _warm() -> int:
    return os.getpid()


class CalibrationWorker:
    """Runs :func:`run_job` off the pipeline thread.

    ``workers`` processes (default :func:`default_workers`), or any ``executor`` given
    (tests pass a thread pool). ``submit`` never blocks: jobs beyond the workers queue in
    the executor, and the engine counts them (``Engine.calibration_backlog``).
    """

    def __init__(self, workers: int | None = None, executor: Executor | None = None,
                 job: Callable[[CalibrationJob], Thresholds] = run_job) -> None:
        self.workers = workers or default_workers()
        self._own = executor is None
        if executor is None:
            executor = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("forkserver"),
                initializer=_lower_priority)
        self._executor = executor
        self._job = job
        self.submitted = 0

    def warm_up(self) -> None:
        """Start the worker processes now (a forkserver start imports numpy and scipy,
        about a second) rather than at the first freeze; never waits."""
        for _ in range(self.workers):
            self._executor.submit(_warm)

    def submit(self, job: CalibrationJob) -> Future[Thresholds]:
        self.submitted += 1
        return self._executor.submit(self._job, job)

    def shutdown(self, wait: bool = False) -> None:
        if self._own:
            self._executor.shutdown(wait=wait, cancel_futures=True)

