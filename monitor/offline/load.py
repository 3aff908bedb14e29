"""Span files -> runs, through the monitor's own pipeline, as a pure function of the spans.

The result does not depend on the order of the records in the files, on how the spans were
batched into records, nor on how the files are split: the same spans always give the same
runs, yielded in the same order (the order the live monitor closes them: end time, then run
id). Nothing is dropped for lateness.

Two passes over the files make that possible with bounded memory. The first counts the
spans of every trace; the second holds each trace open from its first span to its last one
and assembles it (the pipeline's :func:`~assaywatch.monitor.pipeline.assemble.assemble_all`)
as soon as it is complete. Memory is bounded by

* the traces open at once: a trace is open while the reader is between its first and last
  span in the files, so a file written by an OTLP exporter, which keeps a trace's spans
  close together, holds a handful at a time. Above :data:`MAX_OPEN_TRACES` the oldest open
  trace is assembled early and counted (``dropped["evicted_trace"]``); only then could the
  result depend on the files' order;
* the span count per trace id of the first pass (about 100 bytes per trace);
* the assembled runs, kept to be ordered (a run holds counts and names, never content).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from assaywatch.analyzers.model import Run
from assaywatch.monitor.engine.streams import close_order
from assaywatch.monitor.pipeline.assemble import assemble_all
from assaywatch.monitor.pipeline.outcome import DEFAULT_SCORE_THRESHOLD, ContractRules
from assaywatch.monitor.receivers.files import read_spans
from assaywatch.monitor.receivers.files.errors import ReadIssue
from assaywatch.monitor.receivers.spans import IngestCounters, SpanRecord

#: Issues kept verbatim for the report; further ones are only counted.
MAX_ISSUES_KEPT = 50
#: Traces held open at once while reading (see the module docstring).
MAX_OPEN_TRACES = 100_000


@dataclass
class LoadStats:
    files: int = 0
    spans: int = 0
    runs: int = 0
    issues: int = 0
    issue_samples: list[str] = field(default_factory=list)
    #: Problems with a whole file (unreadable, truncated), not one record of it.
    file_issues: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"files": self.files, "spans": self.spans, "runs": self.runs,
                "skipped_records": self.issues, "skipped_samples": self.issue_samples,
                "dropped": self.dropped}


def _span_counts(paths: Sequence[str], strict: bool) -> Counter[str]:
    """Spans per trace id (first pass). Bad records are skipped silently here and reported
    by the second pass, which reads the same records; in strict mode the first bad record
    raises here already, with the same message."""
    counts: Counter[str] = Counter()
    for batch in read_spans(list(paths), strict=strict):
        counts.update(s.trace_id for s in batch)
    return counts


def iter_runs(paths: Sequence[str], *, strict: bool = False,
              rules: ContractRules | None = None,
              score_threshold: float = DEFAULT_SCORE_THRESHOLD,
              stats: LoadStats | None = None,
              max_open_traces: int = MAX_OPEN_TRACES,
              key_attributes: Sequence[str] = ()) -> Iterator[Run]:
    """Yield the runs of span files in the order the live monitor would close them.

    No trace is closed by time (the assembler's grace and age settings do not apply).

    Raises ``SpanFileError`` (file, line, reason) in strict mode at the first bad record;
    otherwise bad records are skipped and counted in ``stats``.
    """
    stats = stats if stats is not None else LoadStats()
    stats.files = len(paths)
    counters = IngestCounters()

    def on_error(issue: ReadIssue) -> None:
        stats.issues += 1
        if issue.line == 0:
            stats.file_issues.append(str(issue))
        if len(stats.issue_samples) < MAX_ISSUES_KEPT:
            stats.issue_samples.append(str(issue))

    expected = _span_counts(paths, strict)

    def assemble(spans: list[SpanRecord]) -> list[Run]:
        return assemble_all(spans, rules=rules, score_threshold=score_threshold,
                            counters=counters, key_attributes=tuple(key_attributes))

    open_traces: dict[str, list[SpanRecord]] = {}  # first-seen order
    runs: list[Run] = []
    for batch in read_spans(list(paths), strict=strict, on_error=on_error):
        stats.spans += len(batch)
        for span in batch:
            tid = span.trace_id
            spans = open_traces.get(tid)
            if spans is None:
                if len(open_traces) >= max_open_traces:
                    oldest = next(iter(open_traces))
                    counters.add_dropped("evicted_trace")
                    runs.extend(assemble(open_traces.pop(oldest)))
                spans = open_traces[tid] = []
            spans.append(span)
            if len(spans) >= expected[tid]:
                runs.extend(assemble(open_traces.pop(tid)))
    for spans in open_traces.values():  # only after an eviction split a trace
        runs.extend(assemble(spans))
    runs.sort(key=close_order)
    stats.runs = len(runs)
    stats.dropped = dict(counters.snapshot()[2])
    yield from runs


def load_runs(paths: Sequence[str], **kw: object) -> tuple[list[Run], LoadStats]:
    stats = LoadStats()
    runs = list(iter_runs(paths, stats=stats, **kw))  # type: ignore[arg-type]
    return runs, stats
