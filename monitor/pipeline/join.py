"""Evaluations joined to their runs, also when the judge answers after the run closed.

An LLM-as-judge evaluator publishes its result seconds to minutes after the run, as the
GenAI event ``gen_ai.evaluation.result`` (an OTLP log record carrying the evaluated span's
trace and span id; the receivers turn it into a ``SpanRecord`` of kind
``KIND_EVALUATION``). The :class:`~assaywatch.monitor.pipeline.assemble.Assembler` routes
each one by the state of its trace:

- **pending** (the trace is still being assembled): the evaluation waits on the trace and
  is attached to the evaluated span when the trace closes, exactly like an evaluation
  recorded on the span itself: it takes part in the run's outcome (``on_trace``);
- **closed within the join window**: the trace's *digest* (its runs' ids, stream keys and
  span ids, a few hundred bytes) names the run; the evaluation is handed to the engine as a
  :class:`LateEvaluation` (``late``). An evaluation of a span that is in none of the
  trace's runs is ``unmatched``; with one run, any span of the trace (or none) names it;
- **not seen yet** (the judge's export overtook the agent's): it waits for its trace, at
  most ``window_s`` and ``max_waiting`` evaluations (``waiting_limit`` beyond); when its
  trace arrives it rides along as if it had arrived with it; one still waiting at the
  end of the window is ``unmatched``.

Digests are kept ``window_s`` after their trace closed, at most ``max_closed`` of them
(the oldest forgotten first, counted ``digest_evicted``). An evaluation without a score,
label or pass flag is ``invalid``. Late evaluations wait for :meth:`take_late`, at most
:data:`MAX_LATE_PENDING` of them (``late_not_taken`` beyond: a stage that never takes them). Every
outcome is counted in :attr:`EvaluationJoin.counts`
(``assaywatch_evaluation_joins_total{outcome}``).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from assaywatch.analyzers.model import Run, StreamKey
from assaywatch.monitor.pipeline.outcome import Evaluation
from assaywatch.monitor.pipeline.runs import labels_of, scores_of
from assaywatch.monitor.receivers.otlp.decode import gc_untrack

#: Late evaluations held for :meth:`EvaluationJoin.take_late` at most.
MAX_LATE_PENDING = 100_000
#: Outcomes counted by :class:`EvaluationJoin` (module docstring).
JOIN_OUTCOMES = ("on_trace", "late", "unmatched", "invalid", "waiting_limit",
                 "digest_evicted", "late_not_taken")


@dataclass(frozen=True, slots=True)
class LateEvaluation:
    """An evaluation of a run the engine has already seen (its trace closed before)."""

    run_id: str
    key: StreamKey
    evaluation: Evaluation
    #: the evaluator's score by name (empty when the evaluation has no score)
    scores: dict[str, float]
    #: the run's start (Unix ns): tells the engine whether the run was one its baseline
    #: learned from
    start_ns: int = 0
    #: the evaluator's label by name, for an evaluation with a label and no score
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _RunDigest:
    """The digest's form in checkpoints written before digests were plain tuples (read
    and converted by :meth:`EvaluationJoin.restamp`)."""

    run_id: str
    key: StreamKey
    span_ids: frozenset[str] | None
    start_ns: int = 0


#: A closed run's digest: (run id, agent, version, scenario, its span ids or None when it
#: is the trace's only run (any span names it), start time in ns). A plain tuple of
#: strings and ints on purpose: the garbage collector stops tracking such tuples, and up
#: to ``max_closed`` traces' digests live for the join window; as objects (a dataclass with
#: a StreamKey and a frozenset) they were most of the objects every full collection
#: walked, ~0.3-0.8 s pauses of the whole monitor at 1,000 runs/s. With the compiled
#: module they are untracked as they are made (``gc_untrack``): otherwise each is walked
#: once by a young collection before the collector untracks it, which at 5,000 runs/s
#: was most of the monitor's collector time (~6% of its CPU).
Digest = tuple[str, str, str, str, tuple[str, ...] | None, int]


def _digest(run_id: str, key: StreamKey, span_ids: Iterable[str] | None,
            start_ns: int) -> Digest:
    return gc_untrack((run_id, key.agent, key.version, key.scenario,
                       None if span_ids is None else gc_untrack(tuple(span_ids)), start_ns))


class EvaluationJoin:
    """The bookkeeping of evaluations that are not on their trace's spans (not
    thread-safe: the assembler calls it under its lock)."""

    def __init__(self, window_s: float = 600.0, max_closed: int = 100_000,
                 max_waiting: int = 10_000) -> None:
        if not window_s >= 0 or max_closed < 1 or max_waiting < 0:
            raise ValueError("EvaluationJoin: window_s >= 0, max_closed >= 1 and "
                             "max_waiting >= 0 are required")
        self.window_s = window_s
        self.max_closed = max_closed
        self.max_waiting = max_waiting
        self.counts: Counter[str] = Counter()
        #: trace id -> (arrival time, span id, evaluation) waiting for the trace
        self._waiting: OrderedDict[str, list[tuple[float, str, Evaluation]]] = OrderedDict()
        self._n_waiting = 0
        #: trace id -> (close time, digests of its runs), in close order
        self._closed: OrderedDict[str, tuple[float, tuple[Digest, ...]]] = OrderedDict()
        self._late: list[LateEvaluation] = []

    @property
    def waiting(self) -> int:
        """Evaluations waiting for a trace not seen yet."""
        return self._n_waiting

    @property
    def digests(self) -> int:
        """Closed traces remembered for late evaluations."""
        return len(self._closed)

    def waits_for(self, trace_id: str) -> bool:
        """Whether evaluations wait for ``trace_id`` (read-only: a consumer that must
        re-read them after a crash holds its input offset below them meanwhile)."""
        return trace_id in self._waiting

    def take_waiting(self, trace_id: str) -> list[tuple[str, Evaluation]]:
        """The evaluations that waited for ``trace_id`` (its first span just arrived)."""
        got = self._waiting.pop(trace_id, None)
        if not got:
            return []
        self._n_waiting -= len(got)
        return [(sid, ev) for _, sid, ev in got]

    def arrive(self, trace_id: str, span_id: str, ev: Evaluation, now: float) -> None:
        """An evaluation whose trace is not pending: late when the trace closed within the
        window, else it waits for the trace."""
        if self.late(trace_id, span_id, ev):
            return
        if self._n_waiting >= self.max_waiting:
            self.counts["waiting_limit"] += 1
            return
        self._waiting.setdefault(trace_id, []).append((now, span_id, ev))
        self._n_waiting += 1

    def late(self, trace_id: str, span_id: str, ev: Evaluation) -> bool:
        """Join ``ev`` to a run of the closed trace ``trace_id``; False when the trace is
        not remembered."""
        entry = self._closed.get(trace_id)
        if entry is None:
            return False
        runs = entry[1]
        target = None
        if len(runs) == 1 and runs[0][4] is None:
            target = runs[0]
        else:
            target = next((r for r in runs if r[4] is not None and span_id in r[4]), None)
        if target is None:
            self.counts["unmatched"] += 1
            return True
        self.counts["late"] += 1
        if len(self._late) >= MAX_LATE_PENDING:
            # nobody takes them (a consumer without an engine, e.g. the Kafka assembler
            # stage): bounded, counted
            self._late.pop(0)
            self.counts["late_not_taken"] += 1
        run_id, agent, version, scenario, _, start_ns = target
        self._late.append(LateEvaluation(run_id, StreamKey(agent, version, scenario), ev,
                                         scores_of([ev]), start_ns, labels_of([ev])))
        return True

    def closed(self, trace_id: str, runs: Sequence[Run], now: float) -> None:
        """Remember the runs of a trace that just closed."""
        if not runs:
            return
        if len(runs) == 1:
            digests = (_digest(runs[0].run_id, runs[0].key, None, runs[0].start_ns),)
        else:
            digests = tuple(_digest(r.run_id, r.key,
                                    (r.root_span_id, *(s.span_id for s in r.steps)),
                                    r.start_ns) for r in runs)
        # untracked at once: the collector would walk them in the youngest generation
        # before finding that they hold no container (digests live the join window)
        self._closed[trace_id] = gc_untrack((now, gc_untrack(digests)))
        self._closed.move_to_end(trace_id)
        while len(self._closed) > self.max_closed:
            self._closed.popitem(last=False)
            self.counts["digest_evicted"] += 1

    def expire(self, now: float, everything: bool = False) -> None:
        """Forget digests and give up waiting evaluations older than the window (all of
        them when ``everything``: the end of an offline replay)."""
        while self._closed:
            tid, (t, _) = next(iter(self._closed.items()))
            if not everything and now - t < self.window_s:
                break
            del self._closed[tid]
        while self._waiting:
            tid, items = next(iter(self._waiting.items()))
            if not everything and now - items[0][0] < self.window_s:
                break
            del self._waiting[tid]
            self._n_waiting -= len(items)
            self.counts["unmatched"] += len(items)

    def restamp(self, now: float) -> None:
        """After a restart (a checkpoint loaded): the times held come from the previous
        process's clock; every digest and waiting evaluation restarts its window at
        ``now`` (late ones already joined are in the engine's checkpoint)."""
        self._closed = OrderedDict(
            (t, (now, tuple(_digest(r.run_id, r.key, r.span_ids, r.start_ns)
                            if isinstance(r, _RunDigest) else r for r in d)))
            for t, (_, d) in self._closed.items())
        for items in self._waiting.values():
            items[:] = [(now, sid, ev) for _, sid, ev in items]
        self._late = []

    def take_late(self) -> list[LateEvaluation]:
        """The late evaluations joined since the last call, in arrival order."""
        out, self._late = self._late, []
        return out
