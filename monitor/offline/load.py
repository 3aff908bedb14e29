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
* the assembled runs waiting to be ordered: at most :data:`SORT_RUNS_IN_MEMORY` (a run
  holds counts and names, never content, ~2.7 KB). Past that, they are sorted in chunks
  written to temporary files as run records (``scaleout/records.encode_run``, which gives
  back equal runs) and merged when read; every :data:`MERGE_FAN_IN` chunks of one size
  are merged into one, so a merge never holds more than a few dozen files open.
"""

from __future__ import annotations

import heapq
import logging
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

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
#: Runs held in memory to be ordered; more are sorted in chunks on disk.
SORT_RUNS_IN_MEMORY = 2_000
#: Chunks of one size merged into one larger chunk.
MERGE_FAN_IN = 16

logger = logging.getLogger(__name__)


class RunSorter:
    """Runs in close order (:func:`close_order`, stable: equal keys keep the order they
    were added in) with at most ``in_memory`` of them in memory; the rest wait in
    temporary files, sorted, one line a run: its end time and run id, a tab, its run
    record."""

    def __init__(self, in_memory: int = SORT_RUNS_IN_MEMORY,
                 fan_in: int = MERGE_FAN_IN) -> None:
        if in_memory < 1 or fan_in < 2:
            raise ValueError(f"RunSorter: in_memory >= 1 and fan_in >= 2, got {in_memory}, "
                             f"{fan_in}")
        self.in_memory, self.fan_in = in_memory, fan_in
        self._runs: list[Run] = []
        #: sorted chunks on disk, in the order their runs were added, with their level
        #: (a chunk of level k holds about in_memory * fan_in ** k runs)
        self._chunks: list[tuple[int, IO[bytes]]] = []
        #: runs no record can hold (kept in memory, ordered with the rest)
        self._kept: list[Run] = []
        #: runs added, and runs written to a chunk
        self.count = self.spilled = 0

    def add(self, runs: Iterable[Run]) -> None:
        n = len(self._runs)
        self._runs.extend(runs)
        self.count += len(self._runs) - n
        if len(self._runs) >= self.in_memory:
            self._spill()

    def _spill(self) -> None:
        from assaywatch.monitor.scaleout.records import encode_run

        self._runs.sort(key=close_order)
        f = tempfile.TemporaryFile(prefix="assaywatch-runs-")
        for run in self._runs:
            try:
                data = encode_run(run)  # compact JSON: no raw newline inside
                if "\t" in run.run_id or "\n" in run.run_id:
                    raise ValueError("a tab or a newline in its id")
            except (ValueError, TypeError) as exc:
                logger.warning("run %r kept in memory to be ordered: %s", run.run_id, exc)
                self._kept.append(run)
                continue
            f.write(b"%d %s\t%s\n" % (run.end_ns, run.run_id.encode(), data))
            self.spilled += 1
        self._runs.clear()
        self._push(0, f)

    def _push(self, level: int, f: IO[bytes]) -> None:
        f.seek(0)
        self._chunks.append((level, f))
        tail = self._chunks[-self.fan_in:]
        if len(tail) == self.fan_in and all(lv == level for lv, _ in tail):
            del self._chunks[-self.fan_in:]
            merged = tempfile.TemporaryFile(prefix="assaywatch-runs-")
            # (key, chunk, line): the chunk's index keeps ties in the order they came
            parts = [_tagged(_lines(g), j) for j, (_, g) in enumerate(tail)]
            merged.writelines(line for _, _, line in heapq.merge(*parts))
            self._push(level + 1, merged)

    def __iter__(self) -> Iterator[Run]:
        from assaywatch.monitor.scaleout.records import decode_run

        self._runs.sort(key=close_order)
        self._kept.sort(key=close_order)
        chunks, kept, runs = self._chunks, self._kept, self._runs
        self._chunks, self._kept, self._runs = [], [], []
        if not chunks and not kept:
            yield from runs
            return
        # (key, source, run or line): the source index keeps the merge stable
        n = len(chunks)
        sources: list[Iterator[tuple[tuple[int, str], int, Any]]] = [
            _tagged(_lines(f), i) for i, (_, f) in enumerate(chunks)]
        sources += [_tagged(((close_order(r), r) for r in kept), n),
                    _tagged(((close_order(r), r) for r in runs), n + 1)]
        for _, i, item in heapq.merge(*sources):
            yield decode_run(item.split(b"\t", 1)[1]) if i < n else item


def _tagged(items: Iterable[tuple[tuple[int, str], Any]], source: int,
            ) -> Iterator[tuple[tuple[int, str], int, Any]]:
    """(key, source, item): merged, ties come out in the order of their sources."""
    for key, item in items:
        yield key, source, item


def _lines(f: IO[bytes]) -> Iterator[tuple[tuple[int, str], bytes]]:
    """A chunk's lines with their order keys (end time, run id); closes the file."""
    with f:
        for line in f:
            head = line[:line.index(b"\t")]
            end, rid = head.split(b" ", 1)
            yield (int(end), rid.decode()), line


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
    runs = RunSorter(SORT_RUNS_IN_MEMORY, MERGE_FAN_IN)  # read here: tests change them
    for batch in read_spans(list(paths), strict=strict, on_error=on_error):
        stats.spans += len(batch)
        for span in batch:
            tid = span.trace_id
            spans = open_traces.get(tid)
            if spans is None:
                if len(open_traces) >= max_open_traces:
                    oldest = next(iter(open_traces))
                    counters.add_dropped("evicted_trace")
                    runs.add(assemble(open_traces.pop(oldest)))
                spans = open_traces[tid] = []
            spans.append(span)
            if len(spans) >= expected[tid]:
                runs.add(assemble(open_traces.pop(tid)))
    for spans in open_traces.values():  # only after an eviction split a trace
        runs.add(assemble(spans))
    stats.runs = runs.count
    stats.dropped = dict(counters.snapshot()[2])
    yield from runs


def load_runs(paths: Sequence[str], **kw: object) -> tuple[list[Run], LoadStats]:
    stats = LoadStats()
    runs = list(iter_runs(paths, stats=stats, **kw))  # type: ignore[arg-type]
    return runs, stats
