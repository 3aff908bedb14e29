"""The monitor's engine over recorded spans: the live pipeline with a file receiver."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from assaywatch.analyzers.baseline import Baseline
from assaywatch.monitor.config import MonitorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import AlarmEvent, StreamState
from assaywatch.monitor.offline.load import LoadStats, iter_runs
from assaywatch.monitor.pipeline.outcome import ContractRules

#: runs read ahead and prepared together (``Engine.prepare``)
REPLAY_CHUNK = 256


@dataclass
class ReplayResult:
    alarms: list[AlarmEvent] = field(default_factory=list)
    streams: list[StreamState] = field(default_factory=list)
    stats: LoadStats = field(default_factory=LoadStats)


def replay(paths: Sequence[str], config: MonitorConfig | None = None,
           baselines: Sequence[Baseline] = (), strict: bool = False) -> ReplayResult:
    cfg = config or MonitorConfig()
    result = ReplayResult()
    engine = Engine(cfg.detectors, baselines, on_alarm=result.alarms.append,
                    max_streams=cfg.limits.max_streams,
                    stream_idle_seconds=cfg.limits.stream_idle_seconds,
                    replace_idle_seconds=cfg.limits.replace_idle_seconds,
                    score_shift=cfg.evaluations.min_drop,
                    score_threshold=cfg.evaluation_threshold,
                    verdict_window_s=cfg.evaluations.join_window_seconds)
    rules = ContractRules.from_dict(cfg.contracts) if cfg.contracts else None
    runs = iter_runs(paths, strict=strict, rules=rules,
                     score_threshold=cfg.evaluation_threshold, stats=result.stats,
                     key_attributes=cfg.streams.key_attributes)
    # in chunks, each prepared in one pass per stream (Engine.prepare: the same values as
    # one run at a time, in the same order)
    while chunk := list(itertools.islice(runs, REPLAY_CHUNK)):
        with engine.prepared(chunk):
            for run in chunk:
                engine.process(run)
    result.streams = engine.streams()
    return result
