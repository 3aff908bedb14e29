"""The live gate's budget caps, per-stream state and spend (read by the report)."""

from __future__ import annotations

from dataclasses import dataclass, field

from assaywatch.analyzers.baseline import Baseline
from assaywatch.analyzers.model import Run, StreamKey
from assaywatch.monitor.live.sequential import StreamTest


class LiveUsageError(Exception):
    """The candidate cannot be gated as configured (no spans, no baseline): exit 3."""


@dataclass
class Caps:
    """Budget caps: runs per stream (None: the gate policy's n_max), money, wall time."""

    max_runs: int | None = None
    max_cost_usd: float | None = None
    max_seconds: float | None = None


@dataclass
class Stream:
    """One baseline stream's live state."""

    baseline: Baseline | None
    key: StreamKey
    test: StreamTest | None = None
    runs: list[Run] = field(default_factory=list)
    crashes: int = 0


@dataclass
class Spend:
    invocations: int = 0
    runs: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    crashed: list[tuple[str, int | None]] = field(default_factory=list)
    unattributed: int = 0
    stopped: str = ""
    proxy_invocations: int = 0
    proxy_runs: int = 0
    proxy_tokens: int = 0
    proxy_cost_usd: float = 0.0
