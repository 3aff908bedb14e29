"""Trace-first checks (SPEC.md 7.3, 6.1): contracts and metamorphic relations on stored runs.

Everything here is judged from runs that were already recorded, so it costs no tokens: the
baseline's runs and the candidate's runs are read from span files and compared.

Units and violations
--------------------
``contracts``
    A run violates when :func:`~assaywatch.monitor.pipeline.outcome.contract_violations`
    lists anything for the configured :class:`ContractRules` (one unit per run).
``format`` relations (oracle relation "format compliance")
    A run violates when its final output length lies outside ``[min, max]``: the only
    format property visible without content (empty answers, runaway generations).
``constraints`` relations (oracle relation "constraint preservation")
    A run violates when it misses a required tool or calls a forbidden one.
``pair`` relations (permutation, idempotence, or any named relation)
    The input marks the pair: the agent's root span carries ``assaywatch.relation`` (the
    relation's name), ``assaywatch.relation.pair`` (a pair id, unique within the stream)
    and ``assaywatch.relation.role`` (``source`` or ``follow-up``; without it the earlier
    run is the source). The assembler keeps these ``assaywatch.*`` root attributes in
    ``Run.attributes``. One unit per follow-up: it violates when a check fails against its
    source. Checks: ``tool_multiset`` (same tools, same call counts), ``tool_set``,
    ``outcome`` (skipped unless both outcomes are decided), ``decision_path`` (same
    (action, tool) sequence). Defaults: ``permutation`` -> tool_multiset + outcome (a
    reordered document list must not change what the agent does or whether it succeeds);
    ``idempotence`` -> decision_path (asking again must take the same path).

The test (Prop. 6.1)
--------------------
A relation holds for version v with violation rate <= eps; a rise beyond eps + delta is a
regression. With the baseline's runs, eps is the baseline's own violation rate, and the
regression verdict (one-sided Fisher, planned power) is applied to the *compliance* rate
(1 - violation rate): Fail when p < alpha and compliance dropped by >= delta, Pass when the
test does not reject and the design had power >= 1 - beta at a drop of delta, else
Inconclusive. Without baseline runs (the gate got a baseline JSON, which keeps no per-run
violations) a configured ``eps`` is tested one-sample: X ~ Binomial(n, v), H0 v <= eps,
p = P(X >= x | eps), power = P(reject | v = eps + delta), same decision rule.

The p-values of all returned tests form one Holm-Bonferroni family (``p_value_holm``), so
an unchanged candidate is held back by some trace-first false positive with probability at
most alpha however many relations are configured; the decision uses the adjusted p-value.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy import stats

from assaywatch.analyzers.model import Outcome, Run, StreamKey, Verdict
from assaywatch.analyzers.suite import holm
from assaywatch.analyzers.verdicts import regression_verdict
from assaywatch.monitor.offline.report import TestResult
from assaywatch.monitor.pipeline.outcome import ContractRules, contract_violations

RELATION_KEY = "assaywatch.relation"
PAIR_KEY = "assaywatch.relation.pair"
ROLE_KEY = "assaywatch.relation.role"
ROLE_SOURCE, ROLE_FOLLOW_UP = "source", "follow-up"
PAIR_CHECKS = ("tool_multiset", "tool_set", "outcome", "decision_path")
DEFAULT_PAIR_CHECKS: dict[str, tuple[str, ...]] = {
    "permutation": ("tool_multiset", "outcome"),
    "idempotence": ("decision_path",),
}
#: Example violations quoted per test (run id: reason).
MAX_SAMPLES = 3


@dataclass(frozen=True)
class Relation:
    """One metamorphic relation judged from traces.

    kind:
        ``format`` (``min_length`` / ``max_length``), ``constraints`` (``required`` /
        ``forbidden`` tools) or ``pair`` (``checks`` on marked pairs).
    """

    name: str
    kind: str
    min_length: int | None = None
    max_length: int | None = None
    required: frozenset[str] = frozenset()
    forbidden: frozenset[str] = frozenset()
    checks: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "relations") -> Relation:
        """``{name, output_min_length?, output_max_length?}`` (format),
        ``{name, required_tools?, forbidden_tools?}`` (constraints) or
        ``{name, checks?}`` (pair; checks default for permutation / idempotence)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
            raise ValueError(f"{where}: each relation is a mapping with a 'name', got {data!r}")
        name = str(data["name"])
        keys = set(data) - {"name"}
        fmt = {"output_min_length", "output_max_length"}
        cons = {"required_tools", "forbidden_tools"}
        if keys and keys <= fmt:
            lo, hi = data.get("output_min_length"), data.get("output_max_length")
            for k, v in (("output_min_length", lo), ("output_max_length", hi)):
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                    raise ValueError(f"{where} {name}: {k} must be an integer >= 0, got {v!r}")
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"{where} {name}: output_min_length {lo} > max {hi}")
            return cls(name, "format", min_length=lo, max_length=hi)
        if keys and keys <= cons:
            tools = {}
            for k in cons:
                v = data.get(k) or []
                if isinstance(v, str) or not all(isinstance(t, str) and t for t in v):
                    raise ValueError(f"{where} {name}: {k} must be a list of tool names")
                tools[k] = frozenset(v)
            return cls(name, "constraints", required=tools["required_tools"],
                       forbidden=tools["forbidden_tools"])
        if keys <= {"checks"}:
            checks = tuple(data.get("checks") or DEFAULT_PAIR_CHECKS.get(name, ()))
            bad = [c for c in checks if c not in PAIR_CHECKS]
            if not checks or bad:
                raise ValueError(
                    f"{where} {name}: a pair relation needs checks from {', '.join(PAIR_CHECKS)}"
                    f" (defaults exist only for {', '.join(DEFAULT_PAIR_CHECKS)}), got "
                    f"{list(checks)}")
            return cls(name, "pair", checks=checks)
        raise ValueError(f"{where} {name}: cannot mix or use keys {sorted(keys)}; a relation "
                         "has output_min/max_length, or required/forbidden_tools, or checks")


def relations_from_config(items: Iterable[Mapping[str, Any]] | None,
                          where: str = "relations") -> list[Relation]:
    out = [Relation.from_mapping(d, f"{where}[{i}]") for i, d in enumerate(items or [])]
    names = [r.name for r in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{where}: relation name(s) {', '.join(dup)} given twice")
    return out


@dataclass
class Tally:
    """Units judged and violations found, with a few examples."""

    units: int = 0
    violations: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, unit_id: str, reasons: Sequence[str]) -> None:
        self.units += 1
        if reasons:
            self.violations += 1
            if len(self.samples) < MAX_SAMPLES:
                self.samples.append(f"{unit_id}: {'; '.join(reasons)}")

    @property
    def rate(self) -> float:
        return self.violations / self.units if self.units else float("nan")


def _pair_reasons(src: Run, fol: Run, checks: Sequence[str]) -> list[str] | None:
    """Failed checks of one pair, or None when no check could be judged."""
    out: list[str] = []
    judged = False
    for c in checks:
        if c == "outcome":
            if Outcome.UNKNOWN in (src.outcome, fol.outcome):
                continue
            if src.outcome is not fol.outcome:
                out.append(f"outcome {src.outcome.value} -> {fol.outcome.value}")
        elif c == "tool_multiset":
            a, b = Counter(src.tools_used), Counter(fol.tools_used)
            if a != b:
                out.append(f"tools {dict(sorted(a.items()))} -> {dict(sorted(b.items()))}")
        elif c == "tool_set":
            if set(src.tools_used) != set(fol.tools_used):
                out.append(f"tool set {sorted(set(src.tools_used))} -> "
                           f"{sorted(set(fol.tools_used))}")
        elif c == "decision_path" and src.decision_path != fol.decision_path:
            out.append(f"decision path of {len(src.steps)} steps -> {len(fol.steps)} steps "
                       "differs")
        judged = True
    return out if judged else None


def relation_tally(runs: Iterable[Run], relation: Relation) -> Tally:
    """Units and violations of one relation over one set of runs."""
    t = Tally()
    if relation.kind == "format":
        for r in runs:
            why = []
            if relation.min_length is not None and r.output_length < relation.min_length:
                why.append(f"output length {r.output_length} < {relation.min_length}")
            if relation.max_length is not None and r.output_length > relation.max_length:
                why.append(f"output length {r.output_length} > {relation.max_length}")
            t.add(r.run_id, why)
        return t
    if relation.kind == "constraints":
        for r in runs:
            used = set(r.tools_used)
            why = [f"required tool {x!r} not called" for x in sorted(relation.required - used)]
            why += [f"forbidden tool {x!r} called" for x in sorted(relation.forbidden & used)]
            t.add(r.run_id, why)
        return t
    groups: dict[tuple[StreamKey, str], list[Run]] = defaultdict(list)
    for r in runs:
        if r.attributes.get(RELATION_KEY) == relation.name and r.attributes.get(PAIR_KEY):
            groups[(r.key, r.attributes[PAIR_KEY])].append(r)
    for (_, pair_id), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        members.sort(key=lambda r: (r.start_ns, r.run_id))
        srcs = [r for r in members if r.attributes.get(ROLE_KEY) == ROLE_SOURCE]
        src = srcs[0] if srcs else members[0]
        for fol in members:
            if fol is src or fol.attributes.get(ROLE_KEY) == ROLE_SOURCE:
                continue
            why = _pair_reasons(src, fol, relation.checks)
            if why is not None:
                t.add(f"pair {pair_id}", why)
    return t


def contract_tally(runs: Iterable[Run], rules: ContractRules) -> Tally:
    t = Tally()
    for r in runs:
        t.add(r.run_id, contract_violations(r, rules))
    return t


def one_sample_test(violations: int, n: int, eps: float, delta: float,
                    alpha: float) -> tuple[float, float]:
    """(p-value, power) of H0 v <= eps against v > eps, X ~ Binomial(n, v).

    p = P(X >= x | eps); power = P(X >= c | eps + delta) with c the smallest count the
    test rejects at level alpha (exact, not the normal approximation: violation rates
    near 0 are where the approximation is worst).
    """
    p = float(stats.binom.sf(violations - 1, n, eps))
    c = int(stats.binom.isf(alpha, n, eps)) + 1  # smallest c with P(X >= c) <= alpha
    while c > 0 and stats.binom.sf(c - 2, n, eps) < alpha:
        c -= 1
    power = float(stats.binom.sf(c - 1, n, min(1.0, eps + delta)))
    return p, power


def _judge(name: str, base: Tally | None, cand: Tally, eps: float,
           policy: Any) -> tuple[TestResult, float | None, float, float]:
    """A TestResult with raw statistics; returns (result, p, drop, power) for Holm."""
    st: dict[str, float | int | str | None] = {
        "violations_candidate": cand.violations, "n_candidate": cand.units,
        "violation_rate_candidate": cand.rate if cand.units else None,
        "delta": policy.delta}
    if base is not None:
        st.update(violations_baseline=base.violations, n_baseline=base.units,
                  violation_rate_baseline=base.rate if base.units else None)
    for i, s in enumerate(cand.samples, 1):
        st[f"example_{i}"] = s
    if cand.units == 0 or (base is not None and base.units == 0):
        side = "candidate" if cand.units == 0 else "baseline"
        return (TestResult(name, Verdict.INCONCLUSIVE.value, st,
                           f"nothing to judge: the {side} has no units for {name}"),
                None, 0.0, 0.0)
    if base is not None:
        r = regression_verdict(base.units - base.violations, base.units,
                               cand.units - cand.violations, cand.units, alpha=policy.alpha,
                               beta=policy.beta, delta=policy.delta, test=policy.test)
        st.update(eps=base.rate, p_value=r.p_value, power=r.power, test=r.test)
        return TestResult(name, "", st), r.p_value, cand.rate - base.rate, r.power
    p, power = one_sample_test(cand.violations, cand.units, eps, policy.delta, policy.alpha)
    st.update(eps=eps, p_value=p, power=power, test="binomial")
    return TestResult(name, "", st), p, cand.rate - eps, power


def trace_first_tests(baseline_runs: Sequence[Run] | None, candidate_runs: Sequence[Run],
                      rules: ContractRules | None, relations: Sequence[Relation],
                      policy: Any, eps: float = 0.05) -> list[TestResult]:
    """Contract and relation tests of one stream (or any set of runs), Holm-adjusted.

    Parameters
    ----------
    baseline_runs:
        The known-good version's runs; None to test against ``eps`` one-sample.
    candidate_runs:
        The candidate's runs.
    rules:
        Contract rules (None or empty: no ``contracts`` test).
    relations:
        Metamorphic relations (:func:`relations_from_config`).
    policy:
        Anything with ``alpha``, ``beta``, ``delta`` and ``test`` (the gate's GatePolicy).
    eps:
        Tolerated violation rate when no baseline runs are given.
    """
    raw: list[tuple[TestResult, float | None, float, float]] = []
    if rules is not None and not rules.is_empty:
        raw.append(_judge("contracts", None if baseline_runs is None
                          else contract_tally(baseline_runs, rules),
                          contract_tally(candidate_runs, rules), eps, policy))
    for rel in relations:
        raw.append(_judge(rel.name, None if baseline_runs is None
                          else relation_tally(baseline_runs, rel),
                          relation_tally(candidate_runs, rel), eps, policy))
    return _adjust(raw, policy)


def _adjust(raw: list[tuple[TestResult, float | None, float, float]],
            policy: Any) -> list[TestResult]:
    tested = [i for i, (_, p, _, _) in enumerate(raw) if p is not None]
    adjusted = holm([float(raw[i][1]) for i in tested]) if tested else []  # type: ignore[arg-type]
    for i, p_adj in zip(tested, adjusted, strict=True):
        res, _, rise, power = raw[i]
        res.statistics["p_value_holm"] = p_adj
        eps = float(res.statistics["eps"] or 0.0)  # type: ignore[arg-type]
        v = float(res.statistics["violation_rate_candidate"] or 0.0)  # type: ignore[arg-type]
        if p_adj < policy.alpha and rise >= policy.delta - 1e-12:
            res.verdict = Verdict.FAIL.value
            res.message = (f"violation rate rose from {eps:.3f} to {v:.3f} (Holm-adjusted "
                           f"p = {p_adj:.2g} < {policy.alpha}; Prop. 6.1: beyond eps + delta)")
        elif p_adj >= policy.alpha and power >= 1 - policy.beta:
            res.verdict = Verdict.PASS.value
            res.message = (f"holds: violation rate {v:.3f} vs eps {eps:.3f} (p = {p_adj:.2g}, "
                           f"power {power:.2f} to see a rise of {policy.delta})")
        elif p_adj < policy.alpha:
            res.verdict = Verdict.INCONCLUSIVE.value
            res.message = f"significant rise {rise:.3f} smaller than delta {policy.delta}"
        else:
            res.verdict = Verdict.INCONCLUSIVE.value
            res.message = (f"not enough units: power {power:.2f} < {1 - policy.beta:.2f} to "
                           f"see a rise of {policy.delta} (violation rate {v:.3f})")
    return [r for r, _, _, _ in raw]


def trace_first_by_stream(baseline_runs: Sequence[Run] | None, candidate_runs: Sequence[Run],
                          rules: ContractRules | None, relations: Sequence[Relation],
                          policy: Any, eps: float = 0.05,
                          ) -> dict[tuple[str, str], list[TestResult]]:
    """:func:`trace_first_tests` per (agent, scenario) -- the gate's matching of a candidate
    version with its baseline -- with one Holm family over every stream's tests."""
    def group(runs: Sequence[Run]) -> dict[tuple[str, str], list[Run]]:
        g: dict[tuple[str, str], list[Run]] = defaultdict(list)
        for r in runs:
            g[(r.key.agent, r.key.scenario)].append(r)
        return g

    cand = group(candidate_runs)
    base = group(baseline_runs) if baseline_runs is not None else None
    raw: list[tuple[TestResult, float | None, float, float]] = []
    owner: list[tuple[str, str]] = []
    for key in sorted(cand):
        b = None if base is None else base.get(key, [])
        # Verdicts are recomputed below from the adjustment over the whole family.
        for res in trace_first_tests(b, cand[key], rules, relations, policy, eps):
            p = res.statistics.get("p_value")
            rise = _rise(res)
            raw.append((res, None if p is None else float(p), rise,
                        float(res.statistics.get("power") or 0.0)))  # type: ignore[arg-type]
            owner.append(key)
    out: dict[tuple[str, str], list[TestResult]] = {k: [] for k in sorted(cand)}
    for key, res in zip(owner, _adjust(raw, policy), strict=True):
        out[key].append(res)
    return out


def _rise(res: TestResult) -> float:
    v, e = res.statistics.get("violation_rate_candidate"), res.statistics.get("eps")
    return float(v) - float(e) if v is not None and e is not None else 0.0  # type: ignore[arg-type]

