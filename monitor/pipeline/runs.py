"""Split one closed trace into runs (DESIGN.md "Data model").

A **run** is the subtree under an *outermost* agent span: an HTTP request trace holding two
agent invocations gives two runs; an agent nested below another is a step of the outer run
(action ``agent``, or ``handoff`` for transfers). A trace with no agent span at all is one
run rooted at its earliest parentless span (else at its earliest SERVER/CONSUMER span
whose parent is remote); when neither arrived the fragments are dropped and counted
``no_root_span`` (a run rooted at a random fragment would carry a wrong key).

Orphans (spans whose parent never arrived, outside every run): a whole orphan subtree is
attached to the run whose root's time window contains the orphan's start, else to the only
run, at depth 1; otherwise it is dropped and counted ``orphan_span``. GenAI spans under a
parentless non-agent root but outside every agent span (a router LLM call in the HTTP
handler) belong to no run and are counted ``outside_run``. Spans whose parent chain loops
(malformed ids) are counted ``span_cycle``.

Everything is iterative (explicit stacks): a 1,000-deep span chain cannot hit the
recursion limit. Steps are ordered by (start_ns, span_id), never by arrival.

Stream key of a run: agent = the root's agent name (``gen_ai.agent.name`` › ``agent.name`` ›
Traceloop entity / Langfuse observation name) › the root's resource ``service.name`` ›
``"unknown_service"``; version = the root's ``gen_ai.agent.version`` (› Traceloop / Langfuse
version) › ``service.version`` › ``""``; scenario = the root's scenario
(``assaywatch.scenario`` › ``gen_ai.workflow.name`` › ``traceloop.workflow.name``) › the
nearest ancestor's (an ``invoke_workflow`` above the agent, the trace root) › the first
step's in step order › ``""``.

Outcome: the oracle (outcome.py) sees the evaluations of the root and of every step (all
must pass), the contract rules and the error flags; its reason is kept in
``Run.attributes["assaywatch.outcome.reason"]``.

Tokens and cost of container steps (nested agents, workflows, chains) are counted only when
no LLM or embedding span lies below them: instrumentations often report the sum of the
children's usage on the container, which would count every token twice.
"""

from __future__ import annotations

from assaywatch.analyzers.model import Action, Run, Step, StreamKey
from assaywatch.monitor.pipeline.normalize import CONTAINER_KINDS, Kind, NormalizedSpan, share
from assaywatch.monitor.pipeline.outcome import (
    DEFAULT_SCORE_THRESHOLD,
    ContractRules,
    Evaluation,
    decide_outcome,
)
from assaywatch.monitor.receivers.spans import IngestCounters, SpanRecord

#: ``Run.attributes`` key of the oracle's reason.
REASON_KEY = "assaywatch.outcome.reason"
#: ``Run.attributes`` key of the tool inventory (sorted names from ``gen_ai.tool.definitions``,
#: comma-separated, at most :data:`MAX_INVENTORY` names).
INVENTORY_KEY = "assaywatch.tool_inventory"
MAX_INVENTORY = 64
UNKNOWN_SERVICE = "unknown_service"
_LLMISH = (Kind.LLM, Kind.EMBEDDING)


class Node:
    """One span kept by a pending trace: ids, times, resource names and the normalized facts.

    The :class:`SpanRecord` itself is not kept, so message content captured in attributes is
    released as soon as the span is classified.
    """

    __slots__ = ("span_id", "parent_id", "name", "start_ns", "end_ns", "norm", "service",
                 "service_version")
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    norm: NormalizedSpan
    service: str | None
    service_version: str | None

    def __init__(self, span: SpanRecord, norm: NormalizedSpan) -> None:
        self.span_id = span.span_id
        self.parent_id = span.parent_span_id
        name = share(span.name)
        assert name is not None
        self.name = name
        self.start_ns = span.start_ns
        self.end_ns = span.end_ns
        self.norm = norm
        res = span.resource
        sn, sv = res.get("service.name"), res.get("service.version")
        self.service = share(sn) if isinstance(sn, str) and sn else None
        self.service_version = share(sv) if isinstance(sv, str) and sv else None


def _order(n: Node) -> tuple[int, str]:
    return (n.start_ns, n.span_id)


class _RunParts:
    """A run being collected: its root and (node, depth, parent id) entries."""

    __slots__ = ("root", "entries")
    root: Node
    entries: list[tuple[Node, int, str]]

    def __init__(self, root: Node) -> None:
        self.root = root
        self.entries: list[tuple[Node, int, str]] = []


def build_runs(trace_id: str, nodes: dict[str, Node], counters: IngestCounters,
               rules: ContractRules | None = None,
               score_threshold: float = DEFAULT_SCORE_THRESHOLD,
               include_generic_steps: bool = False, keep_non_genai: bool = False) -> list[Run]:
    """The runs of one closed trace, sorted by (start_ns, root span id)."""
    if not nodes:
        return []
    children: dict[str, list[Node]] = {}
    tops: list[Node] = []
    for n in nodes.values():
        p = n.parent_id
        if p and p != n.span_id and p in nodes:
            children.setdefault(p, []).append(n)
        else:
            tops.append(n)
    tops.sort(key=_order)

    runs: list[_RunParts] = []
    # Per top: the nodes outside every run, with depth below the top and parent id.
    outside: dict[str, list[tuple[Node, int, str]]] = {}
    has_run: set[str] = set()
    visited = 0
    for top in tops:
        out: list[tuple[Node, int, str]] = []
        stack: list[tuple[Node, int, _RunParts | None, str]] = [(top, 0, None, "")]
        while stack:
            node, depth, run, parent = stack.pop()
            visited += 1
            if run is None and node.norm.is_agent_span:
                run = _RunParts(node)
                runs.append(run)
                has_run.add(top.span_id)
                depth = 0
            elif run is not None:
                run.entries.append((node, depth, parent))
            else:
                out.append((node, depth, parent))
            for c in children.get(node.span_id, ()):
                stack.append((c, depth + 1, run, node.span_id))
        outside[top.span_id] = out
    if visited < len(nodes):
        counters.add_dropped("span_cycle", len(nodes) - visited)

    if not runs:
        if not keep_non_genai and all(n.norm.kind is Kind.GENERIC for n in nodes.values()):
            counters.add_dropped("no_genai_spans", len(nodes))
            return []
        # The earliest true root, else the earliest entry span whose parent is remote.
        roots = [t for t in tops if not t.parent_id] or [t for t in tops if t.norm.is_entry]
        if not roots:  # only fragments below a root that never arrived: no run to build
            counters.add_dropped("no_root_span", len(nodes))
            return []
        root = roots[0]
        main = _RunParts(root)
        for top in tops:
            shift = 0 if top is root else 1
            for node, depth, parent in outside[top.span_id]:
                if node is not root:
                    main.entries.append((node, depth + shift, parent or root.span_id))
        runs = [main]
    else:
        runs.sort(key=lambda r: _order(r.root))
        for top in tops:
            out = outside[top.span_id]
            if not out:
                continue
            if top.span_id in has_run or not top.parent_id or top.norm.is_entry:
                # Context around the runs (an HTTP handler), not part of any run.
                stray = sum(n.norm.kind is not Kind.GENERIC for n, _, _ in out)
                if stray:
                    counters.add_dropped("outside_run", stray)
                continue
            host = _host_run(runs, top)
            if host is None:
                counters.add_dropped("orphan_span", len(out))
                continue
            for node, depth, parent in out:
                host.entries.append((node, depth + 1, parent or host.root.span_id))

    return [_make_run(trace_id, r, nodes, rules, score_threshold, include_generic_steps)
            for r in runs]


def _host_run(runs: list[_RunParts], top: Node) -> _RunParts | None:
    for r in runs:
        if r.root.start_ns <= top.start_ns <= r.root.end_ns:
            return r
    return runs[0] if len(runs) == 1 else None


def _scenario(root: Node, nodes: dict[str, Node], steps: list[Node]) -> str:
    """The root's scenario, else the nearest ancestor's, else the first step's, else ""."""
    chain = [root]
    p = root.parent_id
    while p and len(chain) <= len(nodes):  # bounded: an ancestor cycle cannot loop forever
        anc = nodes.get(p)
        if anc is None:
            break
        chain.append(anc)
        p = anc.parent_id
    for n in (*chain, *steps):
        scenario: str | None = n.norm.scenario
        if scenario:
            return scenario
    return ""


def _make_run(trace_id: str, parts: _RunParts, nodes: dict[str, Node],
              rules: ContractRules | None, score_threshold: float,
              include_generic: bool) -> Run:
    root = parts.root
    # Children before parents (deepest first) to learn which containers hold an LLM call.
    has_llm: set[str] = set()
    for node, _, parent in sorted(parts.entries, key=lambda e: -e[1]):
        if node.norm.kind in _LLMISH or node.span_id in has_llm:
            has_llm.add(parent)
    kept = [(n, d) for n, d, _ in parts.entries
            if include_generic or n.norm.kind is not Kind.GENERIC]
    kept.sort(key=lambda e: _order(e[0]))
    steps: list[Step] = []
    evaluations: list[Evaluation] = list(root.norm.evaluations)
    inventory: set[str] = set(root.norm.tool_definitions)
    for n, depth in kept:
        s = n.norm
        aggregate = s.kind in CONTAINER_KINDS and n.span_id in has_llm
        steps.append(Step(
            action=s.action, tool=s.tool, output_length=s.output_length, error=s.error,
            input_tokens=0 if aggregate else s.input_tokens,
            output_tokens=0 if aggregate else s.output_tokens,
            latency_s=max(0.0, (n.end_ns - n.start_ns) / 1e9),
            cost_usd=None if aggregate else s.cost_usd, depth=depth, start_ns=n.start_ns,
            span_id=n.span_id, parent_span_id=n.parent_id, name=n.name,
            model=s.model if s.action is Action.LLM else None))
        evaluations.extend(s.evaluations)
        inventory.update(s.tool_definitions)

    rn = root.norm
    key = StreamKey(agent=rn.agent_name or root.service or UNKNOWN_SERVICE,
                    version=rn.agent_version or root.service_version or "",
                    scenario=_scenario(root, nodes, [n for n, _ in kept]))
    output_length = rn.output_length
    if output_length <= 0:
        llm_steps = [s for s in steps if s.action is Action.LLM]
        output_length = llm_steps[-1].output_length if llm_steps else 0
    attributes = dict(rn.marks) if rn.marks else {}
    if inventory:
        attributes[INVENTORY_KEY] = ",".join(sorted(inventory)[:MAX_INVENTORY])
    run = Run(trace_id=trace_id, root_span_id=root.span_id, key=key, steps=steps,
              output_length=output_length,
              models=tuple(sorted({s.model for s in steps if s.model})),
              start_ns=root.start_ns, end_ns=root.end_ns, error=rn.error,
              evaluation_score=next((e.score for e in evaluations if e.score is not None),
                                    None),
              attributes=attributes)
    run.outcome, attributes[REASON_KEY] = decide_outcome(run, evaluations, rules,
                                                         score_threshold)
    return run
