"""The outcome oracle: did a production run pass? (DESIGN.md "Outcome of a production run").

Three sources, tried in order, the first that can answer wins:

1. **An evaluation recorded on the trace** -- ``assaywatch.evaluation.passed`` (a boolean
   set by our instrumentation or the app), ``gen_ai.evaluation.score.label`` /
   ``gen_ai.evaluation.score.value`` on a span, or a ``gen_ai.evaluation.result`` span
   event. An explicit evaluation is the only source that actually judges the answer, so it
   outranks everything else.
2. **Contract rules** from the config (:class:`ContractRules`): structural limits a correct
   run must respect (steps, tokens, cost, duration, required / forbidden tools, no error
   spans, output length as the content-free "output format" check).
3. **Error-free run**: pass unless the root span or any step reported an error.

Pass/fail of one evaluation (:func:`judge_evaluation`): the boolean ``passed`` flag if
present; else the label, matched case-insensitively against :data:`PASS_LABELS` /
:data:`FAIL_LABELS`; else the score against a threshold (``score >= threshold`` passes,
default 0.5 because GenAI evaluators mostly report scores in [0, 1]; configure it for
1-5 or 0-100 scales). A label outranks the score because the label is the evaluator's own
decision while the threshold is our guess about its scale. An evaluation that answers none
of these (an unknown label and no score) is ignored and the next source is tried.

Several evaluations on one run (one per evaluator, or one per span) must all pass: a run
judged unfaithful by one evaluator and relevant by another is not a correct run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

from assaywatch.analyzers.model import Outcome, Run

#: Evaluation labels read as a pass (compared lowercased, stripped).
PASS_LABELS = frozenset({
    "pass", "passed", "correct", "success", "succeeded", "successful", "true", "yes",
    "good", "ok", "accept", "accepted", "relevant", "faithful", "grounded", "resolved",
})
#: Evaluation labels read as a failure.
FAIL_LABELS = frozenset({
    "fail", "failed", "incorrect", "wrong", "failure", "false", "no", "bad", "reject",
    "rejected", "irrelevant", "unfaithful", "hallucinated", "hallucination", "error",
    "unresolved", "toxic",
})

#: Default score threshold: ``score >= DEFAULT_SCORE_THRESHOLD`` is a pass.
DEFAULT_SCORE_THRESHOLD = 0.5


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One evaluation found on a span (content-free: a name, a label, a number, a flag).

    Attributes
    ----------
    name:
        ``gen_ai.evaluation.name`` where given (for example ``relevance``).
    label:
        ``gen_ai.evaluation.score.label``.
    score:
        ``gen_ai.evaluation.score.value``.
    passed:
        ``assaywatch.evaluation.passed``.
    """

    name: str | None = None
    label: str | None = None
    score: float | None = None
    passed: bool | None = None


def judge_evaluation(ev: Evaluation, threshold: float = DEFAULT_SCORE_THRESHOLD) -> Outcome:
    """Map one evaluation to PASS / FAIL, or UNKNOWN when it does not say.

    >>> judge_evaluation(Evaluation(label="Correct", score=0.1))
    <Outcome.PASS: 'pass'>
    >>> judge_evaluation(Evaluation(score=0.3), threshold=0.5)
    <Outcome.FAIL: 'fail'>
    """
    if ev.passed is not None:
        return Outcome.PASS if ev.passed else Outcome.FAIL
    if ev.label is not None:
        label = ev.label.strip().lower()
        if label in PASS_LABELS:
            return Outcome.PASS
        if label in FAIL_LABELS:
            return Outcome.FAIL
    if ev.score is not None:
        return Outcome.PASS if ev.score >= threshold else Outcome.FAIL
    return Outcome.UNKNOWN


def _describe(ev: Evaluation) -> str:
    what = f"evaluation {ev.name!r}" if ev.name else "evaluation"
    if ev.passed is not None:
        return f"{what} passed={ev.passed}"
    if ev.label is not None and ev.label.strip().lower() in PASS_LABELS | FAIL_LABELS:
        return f"{what} label {ev.label!r}"
    return f"{what} score {ev.score:g}"


@dataclass(frozen=True, slots=True)
class ContractRules:
    """Structural rules a run must meet when no evaluation is recorded.

    Every rule is off by default (``None`` / empty / False); a run violating any enabled
    rule fails. The output rule works on the output *length* only, because the monitor
    keeps no content: it catches empty answers and runaway generations, the two format
    failures visible without reading the text.

    Attributes
    ----------
    max_steps:
        Most steps a run may take (``len(run.steps)``).
    max_tokens:
        Most input + output tokens over all steps.
    max_cost_usd:
        Most money over the steps that report a cost (skipped when no step reports one).
    max_duration_s:
        Longest root-span duration in seconds.
    required_tools:
        Tools every run must call at least once.
    forbidden_tools:
        Tools no run may call.
    no_error_spans:
        Fail a run with any error step (the root's own error fails under every rule set).
    output_min_length, output_max_length:
        Bounds on the run's final output length (characters, else tokens).
    """

    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_duration_s: float | None = None
    required_tools: frozenset[str] = frozenset()
    forbidden_tools: frozenset[str] = frozenset()
    no_error_spans: bool = False
    output_min_length: int | None = None
    output_max_length: int | None = None

    @property
    def is_empty(self) -> bool:
        """True when no rule is enabled (the oracle then falls back to error-free)."""
        return self == ContractRules()

    @classmethod
    def from_dict(cls, data: Mapping[str, object], where: str = "contracts") -> ContractRules:
        """Build rules from a config mapping, rejecting unknown keys and bad values.

        Parameters
        ----------
        data:
            For example ``{"max_steps": 12, "required_tools": ["search"]}``.
        where:
            Where the mapping came from, quoted in error messages (``"config.yaml:
            contracts"``).

        Raises
        ------
        ValueError
            Naming the unknown keys and the valid ones, or the key with a bad value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a mapping of rule names to values, "
                             f"got {type(data).__name__}")
        valid = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in data if k not in valid)
        if unknown:
            raise ValueError(f"{where}: unknown contract rule(s) {', '.join(unknown)}; "
                             f"valid rules are {', '.join(valid)}")
        kw: dict[str, object] = {}
        for key, value in data.items():
            if value is None:
                continue
            if key in ("required_tools", "forbidden_tools"):
                if isinstance(value, str) or not isinstance(value, Iterable) or not all(
                        isinstance(t, str) and t for t in value):
                    raise ValueError(f"{where}.{key}: expected a list of tool names, "
                                     f"got {value!r}")
                kw[key] = frozenset(value)
            elif key == "no_error_spans":
                if not isinstance(value, bool):
                    raise ValueError(f"{where}.{key}: expected true or false, got {value!r}")
                kw[key] = value
            elif key in ("max_cost_usd", "max_duration_s"):
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise ValueError(f"{where}.{key}: expected a number >= 0, got {value!r}")
                kw[key] = float(value)
            else:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{where}.{key}: expected an integer >= 0, "
                                     f"got {value!r}")
                kw[key] = value
        rules = cls(**kw)  # type: ignore[arg-type]
        both = rules.required_tools & rules.forbidden_tools
        if both:
            raise ValueError(f"{where}: tool(s) {', '.join(sorted(both))} are both required "
                             "and forbidden; no run could pass")
        lo, hi = rules.output_min_length, rules.output_max_length
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"{where}: output_min_length {lo} exceeds output_max_length {hi}")
        return rules


def contract_violations(run: Run, rules: ContractRules) -> list[str]:
    """Every enabled rule the run breaks, one readable line each (empty when none)."""
    out: list[str] = []
    if rules.max_steps is not None and len(run.steps) > rules.max_steps:
        out.append(f"{len(run.steps)} steps > max_steps {rules.max_steps}")
    if rules.max_tokens is not None and run.total_tokens > rules.max_tokens:
        out.append(f"{run.total_tokens} tokens > max_tokens {rules.max_tokens}")
    if rules.max_cost_usd is not None:
        costs = [s.cost_usd for s in run.steps if s.cost_usd is not None]
        if costs and sum(costs) > rules.max_cost_usd:
            out.append(f"cost ${sum(costs):.4g} > max_cost_usd {rules.max_cost_usd:g}")
    if rules.max_duration_s is not None and run.duration_s > rules.max_duration_s:
        out.append(f"duration {run.duration_s:.3g}s > max_duration_s {rules.max_duration_s:g}")
    used = set(run.tools_used)
    for tool in sorted(rules.required_tools - used):
        out.append(f"required tool {tool!r} not called")
    for tool in sorted(rules.forbidden_tools & used):
        out.append(f"forbidden tool {tool!r} called")
    if rules.no_error_spans:
        n = sum(s.error for s in run.steps)
        if n:
            out.append(f"{n} error step(s) with no_error_spans")
    if rules.output_min_length is not None and run.output_length < rules.output_min_length:
        out.append(f"output length {run.output_length} < output_min_length "
                   f"{rules.output_min_length}")
    if rules.output_max_length is not None and run.output_length > rules.output_max_length:
        out.append(f"output length {run.output_length} > output_max_length "
                   f"{rules.output_max_length}")
    return out


def decide_outcome(run: Run, evaluation: Evaluation | Sequence[Evaluation] | None,
                   rules: ContractRules | None = None,
                   score_threshold: float = DEFAULT_SCORE_THRESHOLD) -> tuple[Outcome, str]:
    """The oracle: evaluation, else contract rules, else error-free.

    Parameters
    ----------
    run:
        The assembled run.
    evaluation:
        One evaluation or all found on the run (all must pass; see the module docstring).
    rules:
        Contract rules; ``None`` or empty skips the contract stage.
    score_threshold:
        Score at or above which a bare score passes.

    Returns
    -------
    (outcome, reason)
        The reason is one short content-free line, kept as evidence.
    """
    evs: Sequence[Evaluation]
    if evaluation is None:
        evs = ()
    elif isinstance(evaluation, Evaluation):
        evs = (evaluation,)
    else:
        evs = evaluation
    decided = [(judge_evaluation(e, score_threshold), e) for e in evs]
    decided = [(o, e) for o, e in decided if o is not Outcome.UNKNOWN]
    if decided:
        for o, e in decided:
            if o is Outcome.FAIL:
                return Outcome.FAIL, _describe(e)
        return Outcome.PASS, _describe(decided[0][1])
    if rules is not None and not rules.is_empty:
        violations = contract_violations(run, rules)
        if violations:
            return Outcome.FAIL, "contract: " + "; ".join(violations)
        if run.error:
            # An invocation that itself failed cannot have met its contract.
            return Outcome.FAIL, "contract: root span error"
        return Outcome.PASS, "contract rules met"
    if run.error:
        return Outcome.FAIL, "error-free: root span error"
    n = sum(s.error for s in run.steps)
    if n:
        return Outcome.FAIL, f"error-free: {n} error step(s)"
    return Outcome.PASS, "error-free run"
