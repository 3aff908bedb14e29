"""Trace-level mutation testing of the detectors (SPEC.md 5, read for a monitor).

"Would our alarms catch this change?" Each stream's recorded runs are split in time: the
first part (``split``) freezes a baseline, the rest is mutated by one operator and judged
against it. Operators work on :class:`~assaywatch.analyzers.model.Run` objects:

``noop``             the control: runs copied unchanged (never counted in the score)
``drop_tool:<t>``    every call of tool t removed (one mutant per tool seen)
``swap_model``       the model of every LLM step replaced by another one
``inject_errors``    a failed copy of a random step inserted before it (a failed attempt
                     that was retried)
``truncate_outputs`` the final output and each step's output cut to a quarter
``reorder_steps``    the steps of a run permuted at random (start times re-assigned in
                     the new order, so the run stays well-formed)

A run's outcome is re-decided after mutation when the oracle had decided it from contract
rules or from "error-free" (the ``assaywatch.outcome.reason`` attribute says which): those
depend only on the trace. An outcome from a recorded evaluation is kept: the evaluator
judged the original answer and a trace mutant cannot know its new verdict.

Kills are decided by statistical tests, never by one run of each side (measured on the
released code: a no-op mutant "killed" 31% of the time that way):

``gate``
    :func:`~assaywatch.monitor.offline.gate.decide` of the mutated part against the frozen
    baseline: killed when the pass-rate regression verdict or the Hotelling T^2 test Fails
    after Holm-Bonferroni, so the no-op is killed with probability at most ``alpha``.
``monitor``
    The monitor's :class:`~assaywatch.monitor.engine.Engine` with the frozen baseline, fed
    the mutated runs in order: killed when any configured detector raises an alarm, each at
    its calibrated ARL0 (no-op kill rate about m / ARL0 over m runs, plus the SPRT's alpha
    per decision cycle).

A mutant that changed no run is *equivalent* and excluded; mutation score = killed /
non-equivalent, per method. The no-op control's kill is reported beside the score: if the
control is killed, the kills are not to be trusted.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from assaywatch.analyzers.baseline import Baseline, BaselineBuilder
from assaywatch.analyzers.model import Action, Run, StreamKey
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.engine.streams import AlarmEvent
from assaywatch.monitor.offline.gate import GatePolicy, decide
from assaywatch.monitor.pipeline.outcome import ContractRules, decide_outcome
from assaywatch.monitor.pipeline.runs import REASON_KEY

METHODS = ("gate", "monitor")
SWAPPED_MODEL = "assaywatch-mutant-model"
#: Oracle reasons that depend on the trace only (re-decided after a mutation).
_TRACE_REASONS = ("contract", "error-free")


def copy_run(run: Run) -> Run:
    return dataclasses.replace(run, steps=[dataclasses.replace(s) for s in run.steps],
                               attributes=dict(run.attributes))


def _signature(run: Run) -> tuple[Any, ...]:
    return (run.output_length, run.outcome, run.models, run.error,
            tuple((s.action, s.tool, s.output_length, s.error, s.input_tokens, s.output_tokens,
                   s.model, s.latency_s) for s in run.steps))


def _drop_tool(tool: str) -> Callable[[Run, np.random.Generator], None]:
    def op(run: Run, rng: np.random.Generator) -> None:
        run.steps = [s for s in run.steps if not (s.action is Action.TOOL and s.tool == tool)]
    return op


def _swap_model(run: Run, rng: np.random.Generator) -> None:
    for s in run.steps:
        if s.action is Action.LLM:
            s.model = SWAPPED_MODEL
    if run.models or any(s.action is Action.LLM for s in run.steps):
        run.models = (SWAPPED_MODEL,)


def _inject_errors(run: Run, rng: np.random.Generator) -> None:
    if not run.steps:
        return
    i = int(rng.integers(len(run.steps)))
    orig = run.steps[i]
    failed = dataclasses.replace(orig, error=True, output_length=0, output_tokens=0,
                                 span_id=orig.span_id + "e", name=orig.name + " (failed)")
    run.steps.insert(i, failed)


def _truncate_outputs(run: Run, rng: np.random.Generator) -> None:
    run.output_length //= 4
    for s in run.steps:
        s.output_length //= 4


def _reorder_steps(run: Run, rng: np.random.Generator) -> None:
    starts = [s.start_ns for s in run.steps]
    run.steps = [run.steps[int(j)] for j in rng.permutation(len(run.steps))]
    for s, t in zip(run.steps, starts, strict=True):
        s.start_ns = t


def _noop(run: Run, rng: np.random.Generator) -> None:
    return None


@dataclass(frozen=True)
class Mutant:
    """A trace-level mutation operator (``control``: the no-op, outside the score)."""

    name: str
    description: str
    op: Callable[[Run, np.random.Generator], None] = field(repr=False, compare=False)
    control: bool = False


def default_mutants(runs: Sequence[Run]) -> list[Mutant]:
    """The no-op control, drop-a-tool for every tool seen, and the other operators."""
    tools = sorted({t for r in runs for t in r.tools_used})
    return [Mutant("noop", "unchanged copy (control)", _noop, control=True),
            *(Mutant(f"drop_tool:{t}", f"every call of {t} removed", _drop_tool(t))
              for t in tools),
            Mutant("swap_model", f"LLM steps use {SWAPPED_MODEL}", _swap_model),
            Mutant("inject_errors", "a failed, retried step inserted", _inject_errors),
            Mutant("truncate_outputs", "outputs cut to a quarter", _truncate_outputs),
            Mutant("reorder_steps", "steps permuted", _reorder_steps)]


def mutate_runs(runs: Sequence[Run], mutant: Mutant, rng: np.random.Generator,
                rules: ContractRules | None = None, score_threshold: float = 0.5,
                fraction: float = 1.0) -> tuple[list[Run], int]:
    """Mutated copies of ``runs`` (each mutated with probability ``fraction``) and the
    number of runs that actually changed."""
    out: list[Run] = []
    changed = 0
    for run in runs:
        new = copy_run(run)
        if fraction >= 1.0 or rng.random() < fraction:
            mutant.op(new, rng)
            reason = run.attributes.get(REASON_KEY, "")
            if reason.startswith(_TRACE_REASONS):
                new.outcome, new.attributes[REASON_KEY] = decide_outcome(
                    new, None, rules, score_threshold)
        changed += _signature(new) != _signature(run)
        out.append(new)
    return out, changed


@dataclass
class MutantResult:
    name: str
    description: str
    control: bool
    runs: int
    changed_runs: int
    #: method -> killed
    killed: dict[str, bool] = field(default_factory=dict)
    #: method -> one line of evidence (failed tests with p-values, or alarms)
    evidence: dict[str, str] = field(default_factory=dict)

    @property
    def equivalent(self) -> bool:
        return self.changed_runs == 0 and not self.control

    def status(self, method: str) -> str:
        if self.equivalent:
            return "equivalent"
        k = self.killed.get(method)
        return "-" if k is None else ("killed" if k else "survived")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "control": self.control,
                "runs": self.runs, "changed_runs": self.changed_runs,
                "equivalent": self.equivalent, "killed": dict(self.killed),
                "evidence": dict(self.evidence)}


@dataclass
class MutationReport:
    results: list[MutantResult]
    methods: tuple[str, ...]
    baseline_runs: int
    mutant_runs: int
    settings: dict[str, Any] = field(default_factory=dict)

    def score(self, method: str) -> tuple[int, int]:
        """(killed, non-equivalent) over the non-control mutants."""
        scored = [r for r in self.results if not r.control and not r.equivalent]
        return sum(r.killed.get(method, False) for r in scored), len(scored)

    def control_killed(self, method: str) -> bool:
        return any(r.killed.get(method, False) for r in self.results if r.control)

    def to_dict(self) -> dict[str, Any]:
        scores = {}
        for m in self.methods:
            k, n = self.score(m)
            scores[m] = {"killed": k, "non_equivalent": n, "score": k / n if n else None,
                         "control_killed": self.control_killed(m)}
        return {"baseline_runs": self.baseline_runs, "mutant_runs": self.mutant_runs,
                "settings": self.settings, "scores": scores,
                "mutants": [r.to_dict() for r in self.results]}


def split_runs(runs: Sequence[Run], split: float) -> tuple[list[Run], list[Run]]:
    """Per stream, the first ``split`` share of its runs (in order) and the rest."""
    if not 0 < split < 1:
        raise ValueError(f"split must lie strictly between 0 and 1, got {split!r}")
    by: dict[StreamKey, list[Run]] = defaultdict(list)
    for r in runs:
        by[r.key].append(r)
    head: list[Run] = []
    tail: list[Run] = []
    for key in sorted(by):
        rs = by[key]
        cut = int(round(len(rs) * split))
        head += rs[:cut]
        tail += rs[cut:]
    return head, tail


def freeze_baselines(runs: Sequence[Run], tools: Sequence[str] | None = None) -> list[Baseline]:
    builders: dict[StreamKey, BaselineBuilder] = {}
    for r in runs:
        b = builders.get(r.key)
        if b is None:
            b = builders[r.key] = BaselineBuilder(r.key, tools=list(tools) if tools else None,
                                                  source="mutate: baseline part")
        b.add(r)
    return [builders[k].freeze() for k in sorted(builders)]


def gate_kill(baselines: Sequence[Baseline], runs: Sequence[Run],
              policy: GatePolicy) -> tuple[bool, str]:
    report = decide(baselines, runs, policy)
    failed = [f"{s.name} {t.name} p_holm={t.statistics.get('p_value_holm', float('nan')):.2g}"
              for s in report.streams for t in s.tests
              if t.name in ("pass_rate", "fingerprint") and t.verdict == "fail"]
    if failed:
        return True, "; ".join(failed)
    return False, f"no test failed (gate: {report.decision})"


def monitor_kill(baselines: Sequence[Baseline], runs: Sequence[Run],
                 config: DetectorConfig) -> tuple[bool, str]:
    alarms: list[AlarmEvent] = []
    engine = Engine(config, baselines, on_alarm=alarms.append,
                    max_streams=max(1_000, len(baselines)))
    for run in runs:
        engine.process(run)
    if alarms:
        return True, "; ".join(f"{a.key} {a.detector} at run {a.run_index}"
                               for a in alarms[:5])
    return False, f"no alarm over {len(runs)} runs"


def mutation_test(runs: Sequence[Run], mutants: Sequence[Mutant] | None = None, *,
                  methods: Sequence[str] = METHODS, policy: GatePolicy | None = None,
                  detectors: DetectorConfig | None = None, rules: ContractRules | None = None,
                  score_threshold: float = 0.5, split: float = 0.5, fraction: float = 1.0,
                  seed: int = 0, tools: Sequence[str] | None = None) -> MutationReport:
    """Mutate the held-out part of ``runs`` and decide each mutant's kill per method.

    Parameters
    ----------
    runs:
        Recorded runs of the known-good version, in close order (as loaded).
    mutants:
        Operators (default :func:`default_mutants` of the baseline part).
    methods:
        ``gate`` and/or ``monitor`` (see the module docstring).
    policy, detectors:
        Gate policy and monitor detector configuration used for the kills.
    rules, score_threshold:
        Oracle settings for re-deciding trace-dependent outcomes of mutated runs.
    split:
        Share of each stream's runs (the earliest) frozen as the baseline.
    fraction:
        Probability that a held-out run is mutated.
    seed:
        Seed of the operators' randomness (one stream of numbers per mutant).
    """
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be among {', '.join(METHODS)}, got {list(methods)}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}")
    policy = policy or GatePolicy()
    detectors = detectors or DetectorConfig()
    head, tail = split_runs(runs, split)
    if not head or not tail:
        raise ValueError(f"need runs on both sides of the split, got {len(head)} baseline and "
                         f"{len(tail)} held-out runs; record more runs")
    baselines = freeze_baselines(head, tools)
    mutants = list(mutants) if mutants is not None else default_mutants(head)
    results = []
    for i, m in enumerate(mutants):
        rng = np.random.default_rng([seed, i])
        mutated, changed = mutate_runs(tail, m, rng, rules, score_threshold, fraction)
        res = MutantResult(m.name, m.description, m.control, len(mutated), changed)
        if not res.equivalent:
            for method in methods:
                if method == "gate":
                    res.killed[method], res.evidence[method] = gate_kill(baselines, mutated,
                                                                         policy)
                else:
                    res.killed[method], res.evidence[method] = monitor_kill(
                        baselines, mutated, detectors)
        results.append(res)
    settings = {"split": split, "fraction": fraction, "seed": seed, "alpha": policy.alpha,
                "fingerprint_alpha": policy.fingerprint_alpha, "arl0": detectors.arl0,
                "detectors": list(detectors.detectors)}
    return MutationReport(results, tuple(methods), len(head), len(tail), settings)

