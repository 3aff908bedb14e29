"""A stream's signals and the one protocol the engine runs their detectors through.

A stream holds **signals**: the runs' pass/fail outcome (:data:`OUTCOME`), their behaviour
fingerprint (:data:`FINGERPRINT`) and each evaluator's scores or labels
(:func:`evaluator_signal`). Each alarming detector of a signal is a :class:`Watch`: the
detector (anything with the :class:`~assaywatch.analyzers.detectors.base.SequentialDetector`
surface: ``update``, ``drift_detected``, ``statistic``, ``threshold``, ``evidence``) under
its alarm key. The engine feeds a signal's observation to every watch of that signal, and
the rest works over watches alone, without a case per detector:

* the budget: :func:`watch_shares` splits ``arl0`` over the watches a baseline can run
  (an evaluator's share is an equal part of ``evaluation``);
* the alarm bookkeeping (``alarm_last``, ``alarms_total``, ``alarm_onsets``, the onset
  events and the event log's episodes) goes by the watch's key;
* the exporters read each watch's alarm labels, statistics and threshold;
* the checkpoint keeps the watches as they are (``service/statecodec.py``).

Alarm keys: the detector's name (``cusum_pass_rate``, ``cusum_fingerprint``), or
``evaluation:<evaluator>`` for an evaluator's detector (:func:`alarm_name`). Two tests are
not watches: the SPRT, whose decision is a verdict and which restarts after each one, and
the windowed Hotelling test, a verdict every ``hotelling_every`` runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from assaywatch.analyzers.detectors.base import SequentialDetector

#: The signal of the runs' pass/fail outcomes (one bit per judged run).
OUTCOME = "outcome"
#: The signal of the runs' behaviour fingerprints (one vector per run).
FINGERPRINT = "fingerprint"
#: The detector name of every evaluator's detector (its alarms carry the evaluator).
EVALUATION = "evaluation"


def alarm_name(evaluator: str) -> str:
    """The alarm key of an evaluator's detector in a stream's alarm bookkeeping
    (``alarm_last``, ``alarms_total``, ``alarm_onsets``)."""
    return f"{EVALUATION}:{evaluator}"


def alarm_key(detector: str, evaluator: str) -> str:
    """The alarm key of an alarm's labels (``detector``, ``evaluator``): the inverse of
    :func:`split_alarm_name`."""
    return alarm_name(evaluator) if evaluator else detector


def split_alarm_name(name: str) -> tuple[str, str]:
    """(detector, evaluator) of an alarm key: the labels of its ``assaywatch_alarm``."""
    det, _, evaluator = name.partition(":")
    return det, evaluator


def evaluator_signal(evaluator: str) -> str:
    """The signal of one evaluator's scores or labels."""
    return f"{EVALUATION}:{evaluator}"


@dataclass
class Watch:
    """One alarming detector on one signal of a stream."""

    #: the alarm key (module docstring)
    name: str
    #: the signal whose observations it takes
    signal: str
    #: the detector: ``update(x)``, ``drift_detected``, ``statistic``, ``threshold``,
    #: ``evidence()``
    detector: SequentialDetector
    #: the ``feature`` label of its ``assaywatch_cusum_statistic`` ("": the alarm key);
    #: a detector with ``feature_statistics`` (one chart per feature) exports those
    stat_label: str = ""

    @property
    def labels(self) -> tuple[str, str]:
        """(detector, evaluator): the labels of its alarm series."""
        return split_alarm_name(self.name)

    def observe(self, x: Any) -> dict[str, Any] | None:
        """Feed one observation; the alarm's evidence when the detector fired."""
        det = self.detector
        det.update(x)
        if not det.drift_detected:
            return None
        evidence = dict(det.evidence())
        _, evaluator = self.labels
        if evaluator:
            evidence["evaluator"] = evaluator
        return evidence

    def statistics(self) -> dict[str, float]:
        """Its detection statistics by ``feature`` label."""
        per_feature = getattr(self.detector, "feature_statistics", None)
        if per_feature is not None:
            return dict(per_feature)
        return {self.stat_label or self.name: float(self.detector.statistic)}

    @property
    def threshold(self) -> float:
        return float(self.detector.threshold)


def watch_shares(shares: Mapping[str, float], evaluators: Iterable[str]) -> dict[str, float]:
    """Each watch's normalised part of the ARL0 budget, by alarm key, from the configured
    shares of the detectors a baseline can run (``Engine._shares``): the ``evaluation``
    share goes in equal parts to ``evaluators``; the parts sum to 1 (false-alarm rates add,
    Bonferroni in time)."""
    names = list(evaluators)
    total = sum(shares.values())
    if total <= 0:
        return {}
    out = {k: v / total for k, v in shares.items() if k != EVALUATION}
    if names and shares.get(EVALUATION, 0.0) > 0:
        part = shares[EVALUATION] / total / len(names)
        out.update({alarm_name(n): part for n in names})
    return out
