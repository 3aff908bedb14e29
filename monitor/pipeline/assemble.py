"""The run assembler: spans in, runs out (DESIGN.md "Data model").

Spans are grouped by trace id while the trace is *pending*; a closed trace is split into
runs by :func:`assaywatch.monitor.pipeline.runs.build_runs` (one per outermost agent span,
or outermost chain when no agent span encloses it) and each run gets its outcome from the
oracle.

When a trace closes (``clock()`` is read at every :meth:`Assembler.add` and
:meth:`Assembler.poll`):

- **grace**: the trace is *ready* and no span of it arrived for ``grace_s``. Ready means
  every span whose parent has not arrived is either an agent span (its parent, an HTTP
  handler or a workflow, may come later or live in another service; not a LangGraph
  ``agent`` node, which waits for its graph), a SERVER/CONSUMER entry span, or a root.
  A tool or LLM span waiting for its agent keeps the trace open; OTLP exports spans when
  they *end*, so an agent span arriving means its run has ended.
- **max age**: ``max_age_s`` after the trace was first seen, ready or not (a root that
  never ends, a lost parent).
- **eviction**: above ``max_pending_traces`` the oldest pending trace is closed at once
  (its runs are still produced when it has a root) and counted ``evicted_trace``.

Every discarded span is counted in ``counters.dropped``: ``duplicate_span`` (same span id
twice: the first is kept), ``late_span`` (a span of a trace closed recently; a bounded LRU
of ``closed_lru_size`` trace ids recognises them), ``trace_too_large`` (past
``max_spans_per_trace``), ``bad_span`` (no ids, or classification raised),
``assembly_error`` (building the runs raised: logged, the trace's spans dropped), plus the
reasons of ``build_runs`` (``no_genai_spans``, ``no_root_span``, ``orphan_span``,
``outside_run``, ``span_cycle``). A late span of a trace already forgotten by the LRU opens a new
pending trace and yields a partial run: the LRU bounds memory, not correctness.

Runs are returned by :meth:`poll` / :meth:`flush` (including runs closed by eviction
inside :meth:`add`, returned by the next call); ``on_run``, when given, is called for each
run as it closes. Use one or the other, not both. Methods take an internal lock, so
receivers may call :meth:`add` from several threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable

from assaywatch.analyzers.model import Run
from assaywatch.monitor.pipeline.normalize import classify
from assaywatch.monitor.pipeline.outcome import DEFAULT_SCORE_THRESHOLD, ContractRules
from assaywatch.monitor.pipeline.runs import Node, build_runs
from assaywatch.monitor.receivers.spans import IngestCounters, SpanRecord

logger = logging.getLogger(__name__)


class _Trace:
    """A pending trace: its nodes and what its readiness waits for."""

    __slots__ = ("trace_id", "nodes", "waiting", "bad_tops", "first_seen", "last_seen")

    def __init__(self, trace_id: str, now: float) -> None:
        self.trace_id = trace_id
        self.nodes: dict[str, Node] = {}
        #: parent span id not yet arrived -> children waiting for it
        self.waiting: dict[str, list[str]] = {}
        #: spans whose parent is missing and that cannot stand as a run's top
        self.bad_tops: set[str] = set()
        self.first_seen = now
        self.last_seen = now

    def add(self, node: Node) -> None:
        nodes, sid, parent = self.nodes, node.span_id, node.parent_id
        if parent and parent != sid and parent not in nodes:
            self.waiting.setdefault(parent, []).append(sid)
            norm = node.norm
            # A LangGraph node marked AGENT waits for its graph like any other step.
            if not ((norm.is_agent_span and not norm.graph_node) or norm.is_entry):
                self.bad_tops.add(sid)
        nodes[sid] = node
        kids = self.waiting.pop(sid, None)
        if kids:
            for k in kids:
                self.bad_tops.discard(k)

    @property
    def ready(self) -> bool:
        return not self.bad_tops


class Assembler:
    """Group spans by trace, close traces, split them into runs and judge each run.

    Parameters
    ----------
    clock:
        Seconds, monotonic (``time.monotonic`` live; the replay's span-time clock offline).
    grace_s:
        Quiet time after which a ready trace closes.
    max_age_s:
        Age at which any trace closes.
    max_pending_traces:
        Open traces kept; the oldest is evicted above it.
    max_spans_per_trace:
        Spans kept per trace; more are dropped (``trace_too_large``).
    counters:
        Where drops are counted; a private one when None (see :attr:`counters`).
    on_run:
        Called with every run as it closes.
    rules, score_threshold:
        The oracle's contract rules and evaluation-score threshold
        (:func:`assaywatch.monitor.pipeline.outcome.decide_outcome`).
    closed_lru_size:
        Recently closed trace ids remembered to recognise late spans.
    include_generic_steps:
        Keep spans without any GenAI marker (HTTP/DB client spans) as ``other`` steps.
        Off by default: counting them would make a fingerprint change when someone enables
        an HTTP instrumentation.
    keep_non_genai:
        Produce a run for traces holding no GenAI span at all (health checks, plain HTTP).
        Off by default; their spans are counted ``no_genai_spans``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, grace_s: float = 5.0,
                 max_age_s: float = 300.0, max_pending_traces: int = 10_000,
                 max_spans_per_trace: int = 5_000, counters: IngestCounters | None = None,
                 on_run: Callable[[Run], None] | None = None,
                 rules: ContractRules | None = None,
                 score_threshold: float = DEFAULT_SCORE_THRESHOLD,
                 closed_lru_size: int = 50_000, include_generic_steps: bool = False,
                 keep_non_genai: bool = False) -> None:
        for name, value in (("grace_s", grace_s), ("max_age_s", max_age_s)):
            if not value >= 0:
                raise ValueError(f"Assembler: {name} must be >= 0 seconds, got {value!r}")
        for name, ivalue in (("max_pending_traces", max_pending_traces),
                             ("max_spans_per_trace", max_spans_per_trace),
                             ("closed_lru_size", closed_lru_size)):
            if ivalue < 1:
                raise ValueError(f"Assembler: {name} must be >= 1, got {ivalue!r}")
        self.clock = clock
        self.grace_s = grace_s
        self.max_age_s = max_age_s
        self.max_pending_traces = max_pending_traces
        self.max_spans_per_trace = max_spans_per_trace
        self.counters = counters if counters is not None else IngestCounters()
        self.on_run = on_run
        self.rules = rules
        self.score_threshold = score_threshold
        self.closed_lru_size = closed_lru_size
        self.include_generic_steps = include_generic_steps
        self.keep_non_genai = keep_non_genai
        #: How traces were closed: grace, max_age, evicted, flush.
        self.closed_by: Counter[str] = Counter()
        self._lock = threading.RLock()  # on_run may call back in
        self._pending: dict[str, _Trace] = {}  # first-seen order
        self._idle: OrderedDict[str, _Trace] = OrderedDict()  # last-seen order
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._out: list[Run] = []
        self._logged_bad = False

    @property
    def pending_traces(self) -> int:
        """Traces currently open."""
        return len(self._pending)

    def add(self, spans: list[SpanRecord]) -> None:
        """Take a batch of spans (any order, any trace mix). Never raises for bad spans."""
        now = self.clock()
        counters = self.counters
        with self._lock:
            pending, idle = self._pending, self._idle
            for span in spans:
                tid = span.trace_id
                tr = pending.get(tid)
                if tr is None:
                    if not tid or not span.span_id:
                        counters.add_dropped("bad_span")
                        continue
                    if tid in self._closed:
                        counters.add_dropped("late_span")
                        continue
                    if len(pending) >= self.max_pending_traces:
                        self._evict_oldest()
                    tr = _Trace(tid, now)
                    pending[tid] = tr
                    idle[tid] = tr
                sid = span.span_id
                if sid in tr.nodes:
                    counters.add_dropped("duplicate_span")
                    continue
                if not sid:
                    counters.add_dropped("bad_span")
                    continue
                if len(tr.nodes) >= self.max_spans_per_trace:
                    counters.add_dropped("trace_too_large")
                    continue
                try:
                    node = Node(span, classify(span))
                except Exception:
                    if not self._logged_bad:  # once: a bad producer would flood the log
                        self._logged_bad = True
                        logger.exception("span %s of trace %s could not be classified; "
                                         "dropping it (counted as bad_span)", sid, tid)
                    counters.add_dropped("bad_span")
                    continue
                tr.add(node)
                tr.last_seen = now
                idle.move_to_end(tid)

    def poll(self) -> list[Run]:
        """Close the traces due at ``clock()``; return every run closed since the last call."""
        now = self.clock()
        with self._lock:
            while self._pending:
                tid, tr = next(iter(self._pending.items()))
                if now - tr.first_seen < self.max_age_s:
                    break
                self._close(tid, "max_age")
            due = []
            for tid, tr in self._idle.items():
                if now - tr.last_seen < self.grace_s:
                    break
                if tr.ready:
                    due.append(tid)
            for tid in due:
                self._close(tid, "grace")
            out, self._out = self._out, []
        return out

    def flush(self) -> list[Run]:
        """Close every pending trace (shutdown, end of a replay) and return all runs."""
        with self._lock:
            for tid in list(self._pending):
                self._close(tid, "flush")
            out, self._out = self._out, []
        return out

    def _evict_oldest(self) -> None:
        tid = next(iter(self._pending))
        self.counters.add_dropped("evicted_trace")
        self._close(tid, "evicted")

    def _close(self, tid: str, why: str) -> None:
        tr = self._pending.pop(tid)
        self._idle.pop(tid, None)
        self._closed[tid] = None
        if len(self._closed) > self.closed_lru_size:
            self._closed.popitem(last=False)
        self.closed_by[why] += 1
        try:
            runs = build_runs(tid, tr.nodes, self.counters, rules=self.rules,
                              score_threshold=self.score_threshold,
                              include_generic_steps=self.include_generic_steps,
                              keep_non_genai=self.keep_non_genai)
        except Exception:  # a malformed trace never stops the others from closing
            logger.exception("trace %s could not be assembled; dropping its %d spans "
                             "(counted as assembly_error)", tid, len(tr.nodes))
            self.counters.add_dropped("assembly_error", len(tr.nodes))
            return
        for run in runs:
            if self.on_run is not None:
                try:
                    self.on_run(run)
                except Exception:
                    logger.exception("on_run failed for run %s", run.run_id)
        self._out.extend(runs)


def assemble_all(spans: Iterable[SpanRecord], rules: ContractRules | None = None,
                 score_threshold: float = DEFAULT_SCORE_THRESHOLD,
                 counters: IngestCounters | None = None,
                 max_pending_traces: int = 1_000_000) -> list[Run]:
    """Offline assembly: feed everything, flush, runs sorted by (start_ns, run_id).

    Deterministic: the result does not depend on the order or batching of ``spans``
    (identical duplicates are dropped, orphans attached by rule). No clock is involved:
    every trace stays pending until the final flush, so ``max_pending_traces`` should
    exceed the number of traces (evictions are counted in ``counters``).
    """
    asm = Assembler(clock=lambda: 0.0, max_pending_traces=max_pending_traces,
                    counters=counters, rules=rules, score_threshold=score_threshold)
    batch: list[SpanRecord] = []
    for span in spans:
        batch.append(span)
        if len(batch) >= 4096:
            asm.add(batch)
            batch = []
    asm.add(batch)
    runs = asm.flush()
    runs.sort(key=lambda r: (r.start_ns, r.run_id))
    return runs
