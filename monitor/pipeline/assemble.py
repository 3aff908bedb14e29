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
- **eviction**: above ``max_pending_traces`` traces, or above ``max_pending_bytes`` (the
  estimated memory of the pending spans, :func:`node_bytes`), a pending trace is closed at
  once (its runs are still produced when it has a root). Which one is fair per *sender*
  (the resource's ``service.name``): every sender holding pending traces is entitled to an
  equal share of each limit. A sender above its share gives up its own oldest trace; one
  within its share takes the place of the oldest trace of a sender above its share (the
  oldest such trace among the oldest pending, else the heaviest sender's oldest). So an
  orphan-span flood from one service evicts only that service's traces, never another
  stream's in-flight runs. An eviction is counted per trace: ``sender_quota`` when two or
  more senders hold pending traces and the evicted one's sender was above its share, else
  ``evicted_trace`` (the trace limit) or ``pending_bytes`` (the byte budget).

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
from assaywatch.monitor.config import AssemblerConfig
from assaywatch.monitor.pipeline.join import EvaluationJoin, LateEvaluation
from assaywatch.monitor.pipeline.normalize import ENTRY_BYTES, NormalizedSpan, classify
from assaywatch.monitor.pipeline.outcome import (
    DEFAULT_SCORE_THRESHOLD,
    ContractRules,
    Evaluation,
)
from assaywatch.monitor.pipeline.runs import Node, build_runs, resource_names
from assaywatch.monitor.pipeline.values import evaluation_of
from assaywatch.monitor.receivers.otlp.decode import gc_untrack
from assaywatch.monitor.receivers.spans import KIND_EVALUATION, IngestCounters, SpanRecord

logger = logging.getLogger(__name__)

#: Default of ``max_pending_bytes`` (``assembler.max_pending_bytes`` in the config).
DEFAULT_MAX_PENDING_BYTES: int = AssemblerConfig().max_pending_bytes
#: Estimated bytes of a pending trace without its spans (the ``_Trace``, its dicts, the
#: trace id, its entries in the first-seen, idle and per-sender tables), and of one span
#: kept as a :class:`Node` (the node, its ``NormalizedSpan``, two hex ids, the trace's
#: dict entry) before its variable-size facts. Measured with ``tracemalloc`` on CPython
#: 3.11 (tests/monitor/test_assemble.py checks the estimate against it).
TRACE_BYTES = 900
SPAN_BYTES = 360
#: Per mapping entry (evaluations, tool definitions, run marks).
_ENTRY_BYTES = ENTRY_BYTES
#: Sender key of spans without a string ``service.name``.
UNKNOWN_SENDER = ""
#: Oldest pending traces looked at for one of a sender above its share before the senders
#: are scanned for the heaviest (bounds the work of one eviction).
_VICTIM_WALK = 64


def node_bytes(node: Node) -> int:
    """Estimated memory a pending trace holds for one span: a fixed part plus the sizes of
    the attribute values the span keeps (its name and service names, and the values of
    its :class:`NormalizedSpan`, :func:`kept_bytes`). Names are mostly shared between
    spans (``runs.share``), so their characters are counted without an object header: the
    estimate stays an upper bound without charging a name twice. Message content is not
    kept (only its length), so it does not count."""
    n = node.norm
    kept = n.nbytes
    if kept < 0:
        kept = n.nbytes = kept_bytes(n)
    size = SPAN_BYTES + len(node.name) + kept
    if node.service:
        size += len(node.service)
    if node.service_version:
        size += len(node.service_version)
    return size


def kept_bytes(n: NormalizedSpan) -> int:
    """The part of :func:`node_bytes` a span's :class:`NormalizedSpan` holds: the
    characters of its tool, agent, version, scenario, model and provider names, and its
    evaluations, tool definitions and run marks (``NormalizedSpan.nbytes`` keeps it)."""
    # filter(None, ...) leaves out the absent (None) and empty names: C-level passes
    size = sum(map(len, filter(None, (n.tool, n.agent_name, n.agent_version, n.scenario,
                                      n.model, n.provider))))
    if n.evaluations:
        size += len(n.evaluations) * 2 * _ENTRY_BYTES
    if n.tool_definitions:
        size += sum(_ENTRY_BYTES + len(t) for t in n.tool_definitions)
    if n.marks:
        size += sum(_ENTRY_BYTES + len(k) + len(v) for k, v in n.marks.items())
    return size


def sender_of(span: SpanRecord) -> str:
    """The sender a span is accounted to: its resource's ``service.name``."""
    name = span.resource.get("service.name")
    return name if isinstance(name, str) else UNKNOWN_SENDER


class _Sender:
    """One sender's pending traces (first-seen order) and their estimated bytes."""

    __slots__ = ("traces", "nbytes")

    def __init__(self) -> None:
        self.traces: dict[str, _Trace] = {}
        self.nbytes = 0


class _Trace:
    """A pending trace: its nodes and what its readiness waits for."""

    __slots__ = ("trace_id", "nodes", "waiting", "bad_tops", "first_seen", "last_seen",
                 "sender", "nbytes", "evals")

    def __init__(self, trace_id: str, now: float, sender: str = UNKNOWN_SENDER) -> None:
        self.trace_id = trace_id
        self.sender = sender
        self.nbytes = TRACE_BYTES
        self.nodes: dict[str, Node] = {}
        #: parent span id not yet arrived -> children waiting for it
        self.waiting: dict[str, list[str]] = {}
        #: spans whose parent is missing and that cannot stand as a run's top
        self.bad_tops: set[str] = set()
        self.first_seen = now
        self.last_seen = now
        #: evaluations received as log events: (evaluated span id, evaluation)
        self.evals: list[tuple[str, Evaluation]] = []

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
        Open traces kept; above it a trace is evicted, fairly per sender.
    max_pending_bytes:
        Estimated bytes of the pending traces (:func:`node_bytes`) kept; above it traces
        are evicted, fairly per sender. None: no byte limit (offline assembly).
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
    join_window_s, max_closed_runs, max_waiting_evaluations:
        The join of evaluations received as log events (``pipeline/join.py``); late ones
        are returned by :meth:`take_evaluations`.
    key_attributes:
        Extra stream key attributes (``streams.key_attributes``): their values on a run's
        root (or its resource; a model attribute falls back to the first model call) are
        appended to the scenario, ``refund [gen_ai.request.model=gpt-4o-mini]``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, grace_s: float = 5.0,
                 max_age_s: float = 300.0, max_pending_traces: int = 10_000,
                 max_spans_per_trace: int = 5_000, counters: IngestCounters | None = None,
                 on_run: Callable[[Run], None] | None = None,
                 rules: ContractRules | None = None,
                 score_threshold: float = DEFAULT_SCORE_THRESHOLD,
                 closed_lru_size: int = 50_000, include_generic_steps: bool = False,
                 keep_non_genai: bool = False,
                 max_pending_bytes: int | None = DEFAULT_MAX_PENDING_BYTES,
                 join_window_s: float = 600.0, max_closed_runs: int = 100_000,
                 max_waiting_evaluations: int = 10_000,
                 key_attributes: tuple[str, ...] = ()) -> None:
        for name, value in (("grace_s", grace_s), ("max_age_s", max_age_s)):
            if not value >= 0:
                raise ValueError(f"Assembler: {name} must be >= 0 seconds, got {value!r}")
        for name, ivalue in (("max_pending_traces", max_pending_traces),
                             ("max_spans_per_trace", max_spans_per_trace),
                             ("closed_lru_size", closed_lru_size)):
            if ivalue < 1:
                raise ValueError(f"Assembler: {name} must be >= 1, got {ivalue!r}")
        if max_pending_bytes is not None and max_pending_bytes < TRACE_BYTES + SPAN_BYTES:
            raise ValueError("Assembler: max_pending_bytes must be None or at least "
                             f"{TRACE_BYTES + SPAN_BYTES} (one span), got "
                             f"{max_pending_bytes!r}")
        self.clock = clock
        self.grace_s = grace_s
        self.max_age_s = max_age_s
        self.max_pending_traces = max_pending_traces
        self.max_pending_bytes = max_pending_bytes
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
        self._senders: dict[str, _Sender] = {}
        self._bytes = 0
        self._out: list[Run] = []
        self._logged_bad = False
        self.join = EvaluationJoin(join_window_s, max_closed_runs, max_waiting_evaluations)
        self.key_attributes = tuple(key_attributes)

    @property
    def pending_traces(self) -> int:
        """Traces currently open."""
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        """Estimated bytes held by the open traces (see :func:`node_bytes`)."""
        return self._bytes

    def sender_usage(self) -> dict[str, tuple[int, int]]:
        """Pending traces and estimated bytes per sender."""
        with self._lock:
            return {name: (len(snd.traces), snd.nbytes)
                    for name, snd in self._senders.items()}

    def add(self, spans: list[SpanRecord]) -> None:
        """Take a batch of spans (any order, any trace mix). Never raises for bad spans."""
        now = self.clock()
        counters = self.counters
        key_attributes = self.key_attributes
        # Spans of one ResourceSpans share their resource dict: its names are read once.
        resource: object = None
        names: tuple[str | None, str | None] = (None, None)
        with self._lock:
            pending, idle, senders = self._pending, self._idle, self._senders
            for span in spans:
                tid = span.trace_id
                tr = pending.get(tid)
                if span.kind == KIND_EVALUATION:
                    self._evaluation(span, tr, now)
                    continue
                if tr is None:
                    if not tid or not span.span_id:
                        counters.add_dropped("bad_span")
                        continue
                    if tid in self._closed:
                        counters.add_dropped("late_span")
                        continue
                    sender = sender_of(span)
                    if len(pending) >= self.max_pending_traces:
                        self._evict(sender, by_bytes=False)
                    tr = _Trace(tid, now, sender)
                    tr.evals = self.join.take_waiting(tid)
                    pending[tid] = tr
                    idle[tid] = tr
                    snd = senders.get(sender)
                    if snd is None:
                        snd = senders[sender] = _Sender()
                    snd.traces[tid] = tr
                    snd.nbytes += TRACE_BYTES
                    self._bytes += TRACE_BYTES
                sid = span.span_id
                nodes = tr.nodes
                if sid in nodes:
                    counters.add_dropped("duplicate_span")
                    continue
                if not sid:
                    counters.add_dropped("bad_span")
                    continue
                if len(nodes) >= self.max_spans_per_trace:
                    counters.add_dropped("trace_too_large")
                    continue
                try:
                    if span.resource is not resource:
                        names = resource_names(span.resource)
                        resource = span.resource
                    norm = span.norm  # classified by the compiled decoder
                    if norm is None or key_attributes:
                        norm = classify(span, key_attributes)
                    # Not tracked by the cycle collector (it holds strings, numbers and
                    # the NormalizedSpan, never a reference back): a young collection
                    # would walk every pending trace's nodes for nothing.
                    node = gc_untrack(Node(span, norm, names))
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
                size = node_bytes(node)
                tr.nbytes += size
                senders[tr.sender].nbytes += size
                self._bytes += size
                limit = self.max_pending_bytes
                while limit is not None and self._bytes > limit and pending:
                    self._evict(tr.sender, by_bytes=True)

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
            self.join.expire(now)
            out, self._out = self._out, []
        return out

    def take_evaluations(self) -> list[LateEvaluation]:
        """Evaluations joined to runs closed earlier (``pipeline/join.py``), in arrival
        order; call after :meth:`poll` / :meth:`flush` and feed them to the engine after
        the runs those returned."""
        with self._lock:
            return self.join.take_late()

    def _evaluation(self, span: SpanRecord, tr: _Trace | None, now: float) -> None:
        ev = evaluation_of(span.attributes)
        if ev is None or not span.trace_id:
            self.join.counts["invalid"] += 1
            return
        if tr is not None:
            tr.evals.append((span.span_id, ev))
            tr.nbytes += _ENTRY_BYTES
            self._senders[tr.sender].nbytes += _ENTRY_BYTES
            self._bytes += _ENTRY_BYTES
            return
        self.join.arrive(span.trace_id, span.span_id, ev, now)

    def flush(self) -> list[Run]:
        """Close every pending trace (shutdown, end of a replay) and return all runs."""
        with self._lock:
            for tid in list(self._pending):
                self._close(tid, "flush")
            self.join.expire(self.clock(), everything=True)
            out, self._out = self._out, []
        return out

    def _evict(self, arriving: str, by_bytes: bool) -> None:
        """Close one pending trace to make room for ``arriving``'s span (see the module
        docstring: the arriving sender's own oldest when it is above its share, else the
        oldest trace of a sender above its share)."""
        senders = self._senders
        n = len(senders) + (arriving not in senders)
        if by_bytes:
            assert self.max_pending_bytes is not None
            share = self.max_pending_bytes / n

            def usage(snd: _Sender) -> float:
                return snd.nbytes
        else:
            share = self.max_pending_traces / n

            def usage(snd: _Sender) -> float:
                return len(snd.traces)
        own = senders.get(arriving)
        victim: _Sender | None = None
        if own is not None and own.traces and (usage(own) + (not by_bytes) > share):
            victim = own
        else:
            for i, tr in enumerate(self._pending.values()):
                if i >= _VICTIM_WALK:
                    break
                snd = senders[tr.sender]
                if usage(snd) > share:
                    victim = snd
                    break
            if victim is None:  # none among the oldest: the heaviest sender
                victim = max(senders.values(), key=usage)
        tid = next(iter(victim.traces))
        if n > 1 and usage(victim) + (victim is own and not by_bytes) > share:
            reason = "sender_quota"
        else:
            reason = "pending_bytes" if by_bytes else "evicted_trace"
        self.counters.add_dropped(reason)
        self._close(tid, "evicted")

    def _close(self, tid: str, why: str) -> None:
        tr = self._pending.pop(tid)
        self._idle.pop(tid, None)
        snd = self._senders[tr.sender]
        del snd.traces[tid]
        snd.nbytes -= tr.nbytes
        self._bytes -= tr.nbytes
        if not snd.traces:
            del self._senders[tr.sender]
        self._closed[tid] = None
        if len(self._closed) > self.closed_lru_size:
            self._closed.popitem(last=False)
        self.closed_by[why] += 1
        leftover: list[tuple[str, Evaluation]] = []
        for sid, ev in tr.evals:
            node = tr.nodes.get(sid)
            if node is None:
                leftover.append((sid, ev))
                continue
            node.norm.evaluations = (*node.norm.evaluations, ev)
            self.join.counts["on_trace"] += 1
        try:
            runs = build_runs(tid, tr.nodes, self.counters, rules=self.rules,
                              score_threshold=self.score_threshold,
                              include_generic_steps=self.include_generic_steps,
                              keep_non_genai=self.keep_non_genai,
                              key_attributes=self.key_attributes)
        except Exception:  # a malformed trace never stops the others from closing
            logger.exception("trace %s could not be assembled; dropping its %d spans "
                             "(counted as assembly_error)", tid, len(tr.nodes))
            self.counters.add_dropped("assembly_error", len(tr.nodes))
            return
        self.join.closed(tid, runs, self.clock())
        for sid, ev in leftover:  # evaluated span not among the trace's spans
            if not self.join.late(tid, sid, ev):
                self.join.counts["unmatched"] += 1
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
                 max_pending_traces: int = 1_000_000,
                 key_attributes: tuple[str, ...] = ()) -> list[Run]:
    """Offline assembly: feed everything, flush, runs sorted by (start_ns, run_id).

    Deterministic: the result does not depend on the order or batching of ``spans``
    (identical duplicates are dropped, orphans attached by rule). No clock is involved:
    every trace stays pending until the final flush, so ``max_pending_traces`` should
    exceed the number of traces (evictions are counted in ``counters``).
    """
    asm = Assembler(clock=lambda: 0.0, max_pending_traces=max_pending_traces,
                    counters=counters, rules=rules, score_threshold=score_threshold,
                    max_pending_bytes=None, key_attributes=key_attributes)
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
