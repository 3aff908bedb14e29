"""Problems found while reading span files, and how they are reported."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["IssueCallback", "ReadIssue", "ReadStats", "SpanFileError"]


@dataclass(frozen=True, slots=True)
class ReadIssue:
    """One bad record of a span file.

    Attributes
    ----------
    path:
        The file.
    line:
        1-based line for text formats, 1-based frame number for length-prefixed proto
        files, 0 when the problem concerns the whole file.
    reason:
        What was wrong and, where it helps, what to do.
    """

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.reason}"


class SpanFileError(ValueError):
    """Raised in strict mode at the first :class:`ReadIssue`."""

    def __init__(self, issue: ReadIssue) -> None:
        super().__init__(str(issue))
        self.issue = issue


#: ``on_error`` callback type of :func:`~assaywatch.monitor.receivers.files.read_spans`.
IssueCallback = Callable[[ReadIssue], None]


@dataclass(slots=True)
class ReadStats:
    """Totals of one :func:`~assaywatch.monitor.receivers.files.read_spans` call.

    ``records`` counts lines, frames or documents read; ``issues`` the bad ones skipped;
    ``spans`` the spans yielded; ``evaluations`` the evaluation records yielded (the
    ``gen_ai.evaluation.result`` log records of OTLP logs lines or frames) and
    ``other_log_records`` the other log records skipped; ``rejected`` spans and evaluation
    records refused individually (by reason); ``limited`` values truncated or
    attributes/events dropped by the decode limits.
    """

    files: int = 0
    records: int = 0
    spans: int = 0
    evaluations: int = 0
    other_log_records: int = 0
    issues: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    limited: Counter[str] = field(default_factory=Counter)
