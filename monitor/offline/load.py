"""Span files -> runs, through the monitor's own pipeline with a file receiver.

The assembler runs on *span time*: its clock is the latest span end time read so far, so
a run closes once the file has moved ``grace`` seconds past it, exactly as the live monitor
closes it ``grace`` seconds of wall time after its last span. Memory stays bounded by the
open traces, not by the file size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from assaywatch.analyzers.model import Run
from assaywatch.monitor.engine.streams import close_order
from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.outcome import ContractRules
from assaywatch.monitor.receivers.files import read_spans
from assaywatch.monitor.receivers.files.errors import ReadIssue
from assaywatch.monitor.receivers.spans import IngestCounters

#: Issues kept verbatim for the report; further ones are only counted.
MAX_ISSUES_KEPT = 50


@dataclass
class LoadStats:
    files: int = 0
    spans: int = 0
    runs: int = 0
    issues: int = 0
    issue_samples: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"files": self.files, "spans": self.spans, "runs": self.runs,
                "skipped_records": self.issues, "skipped_samples": self.issue_samples,
                "dropped": self.dropped}


class _SpanClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def iter_runs(paths: Sequence[str], *, strict: bool = False,
              rules: ContractRules | None = None, score_threshold: float = 0.5,
              grace_s: float = 5.0, max_age_s: float = 300.0,
              stats: LoadStats | None = None) -> Iterator[Run]:
    """Yield the runs of span files in the order the live monitor would close them.

    Raises ``SpanFileError`` (file, line, reason) in strict mode at the first bad record;
    otherwise bad records are skipped and counted in ``stats``.
    """
    stats = stats if stats is not None else LoadStats()
    stats.files = len(paths)
    counters = IngestCounters()
    clock = _SpanClock()
    asm = Assembler(clock=clock, grace_s=grace_s, max_age_s=max_age_s,
                    max_pending_traces=100_000, counters=counters, rules=rules,
                    score_threshold=score_threshold)

    def on_error(issue: ReadIssue) -> None:
        stats.issues += 1
        if len(stats.issue_samples) < MAX_ISSUES_KEPT:
            stats.issue_samples.append(str(issue))

    for batch in read_spans(list(paths), strict=strict, on_error=on_error):
        if not batch:
            continue
        stats.spans += len(batch)
        asm.add(batch)
        latest = max(s.end_ns or s.start_ns for s in batch) / 1e9
        if latest > clock.now:
            clock.now = latest
        for run in sorted(asm.poll(), key=close_order):
            stats.runs += 1
            yield run
    for run in sorted(asm.flush(), key=close_order):
        stats.runs += 1
        yield run
    stats.dropped = dict(counters.snapshot()[2])


def load_runs(paths: Sequence[str], **kw: object) -> tuple[list[Run], LoadStats]:
    stats = LoadStats()
    runs = list(iter_runs(paths, stats=stats, **kw))  # type: ignore[arg-type]
    return runs, stats
