"""What a gate decides, as plain data: the writers (JUnit XML, Markdown, HTML) read this."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TestResult:
    """One statistical test of one stream.

    name:
        ``pass_rate`` (regression verdict), ``fingerprint`` (Hotelling T^2), ``coverage``,
        ``contracts``, ``sprt`` (live gate), or a metamorphic relation's name.
    verdict:
        ``pass`` / ``fail`` / ``inconclusive``.
    statistics:
        Numbers behind the verdict (p-value, adjusted p-value, power, effect sizes, n, ...),
        JSON-safe scalars: they become JUnit properties.
    message:
        One line in plain words: what was found and why it decides so.
    """

    name: str
    verdict: str
    statistics: dict[str, float | int | str | None] = field(default_factory=dict)
    message: str = ""


@dataclass
class StreamResult:
    agent: str
    version: str
    scenario: str
    baseline_version: str
    tests: list[TestResult] = field(default_factory=list)
    #: pass rates with 95% Wilson bounds: {"baseline": (p, lo, hi, n), "candidate": (...)}
    pass_rates: dict[str, tuple[float, float, float, int]] = field(default_factory=dict)
    #: standardised shift per fingerprint feature, largest |shift| first
    feature_shifts: list[tuple[str, float]] = field(default_factory=list)
    #: coverage per dimension (tool, path, state, boundary, model, overall)
    coverage: dict[str, float] = field(default_factory=dict)
    #: SPRT log-likelihood ratio after each run, with its boundaries, when a SPRT ran
    sprt_path: list[float] = field(default_factory=list)
    sprt_bounds: tuple[float, float] | None = None

    @property
    def name(self) -> str:
        return f"{self.agent}/{self.scenario or '-'}"


@dataclass
class GateReport:
    decision: str  # deploy | block | manual
    exit_code: int  # 0 | 1 | 2
    reason: str
    config: dict[str, Any] = field(default_factory=dict)
    streams: list[StreamResult] = field(default_factory=list)
    #: input accounting: files, spans read, lines skipped (with file:line reasons), runs
    inputs: dict[str, Any] = field(default_factory=dict)
    #: live gate only: runs and tokens spent, and what a fixed-n design would have spent
    spend: dict[str, Any] = field(default_factory=dict)
