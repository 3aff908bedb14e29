"""Split one closed trace into runs (DESIGN.md "Data model"; monitor/README.md "Run
assembly per instrumentation").

A **run** is one invocation of an agent: the subtree under an *outermost* run root. Run
roots, outermost first wins:

- an agent or workflow span (``invoke_agent``, ``invoke_workflow``, OpenInference ``AGENT``,
  Traceloop ``agent`` / ``workflow``, Langfuse ``agent``), except a LangGraph node (an
  OpenInference ``AGENT`` span named ``agent``, see ``GRAPH_NODE_NAMES``) below a
  container span: that is the graph's model node, not an agent of its own;
- an outermost chain (OpenInference ``CHAIN``, Traceloop ``task``, Langfuse ``chain``,
  ``execute_task``) with no GenAI span above it: a LangGraph graph or LangChain runnable
  invoked without any agent span (the graph's default name ``LangGraph``).

An HTTP request trace holding two agent invocations gives two runs; an agent nested below
another is a step of the outer run (action ``agent``, or ``handoff`` for transfers). A
trace with no run root at all is one run rooted at its earliest parentless span (else at
its earliest SERVER/CONSUMER span whose parent is remote); when neither arrived the
fragments are dropped and counted ``no_root_span`` (a run rooted at a random fragment
would carry a wrong key). A run root that is itself a model, embedding, retrieval, tool or
handoff call (a bare ``chat`` span, nothing wraps it) is also the run's first step, at
depth 1; spans it encloses nest one level deeper.

**Plumbing** is neither a step nor a nesting level: chains below the run root (LangGraph
nodes and edges such as ``tools``, ``should_continue``; ``RunnableSequence``, ``Prompt``;
Traceloop tasks) and LangGraph ``agent`` nodes below their graph. Their children take their
place (depth and parent); their evaluations and tool inventory are the run's, and an error
they report goes to the nearest enclosing step, or to the run's root.

**Entry agent.** A run rooted at a workflow span that carries no agent name (Traceloop
``@workflow``, the GenAI ``invoke_workflow`` of openai-agents) takes the agent name and
version of the first agent span directly below it (through plumbing, by start time), and
that agent span is not a step: the workflow is that agent's invocation. Agents after it
(an openai-agents handoff target) stay ``agent`` steps, so the stream does not change with
whether a handoff happened.

Orphans (spans whose parent never arrived, outside every run): a whole orphan subtree is
attached to the run whose root's time window contains the orphan's start, else to the only
run, at depth 1; otherwise it is dropped and counted ``orphan_span``. GenAI spans under a
parentless non-agent root but outside every run root (a router LLM call in the HTTP
handler) belong to no run and are counted ``outside_run`` (plumbing is not counted). Spans
whose parent chain loops (malformed ids) are counted ``span_cycle``.

Everything is iterative (explicit stacks): a 1,000-deep span chain cannot hit the
recursion limit. Steps are ordered by (start_ns, span_id), never by arrival.

Stream key of a run: agent = the root's agent name (``gen_ai.agent.name`` › ``agent.name`` ›
Traceloop entity / Langfuse observation / OpenInference AGENT span name) › the entry
agent's › the root's resource ``service.name`` › ``"unknown_service"``; version = the
root's ``gen_ai.agent.version`` (› Traceloop / Langfuse version) › the entry agent's ›
``service.version`` › ``""``; scenario = the root's scenario (``assaywatch.scenario`` ›
``gen_ai.workflow.name`` › ``traceloop.workflow.name``) › the nearest ancestor's (an
``invoke_workflow`` above the agent, the trace root) › the first step's in step order ›
``""``.

Outcome: the oracle (outcome.py) sees the evaluations of the root, of every step and of
the plumbing (all must pass), the contract rules and the error flags; its reason is kept
in ``Run.attributes["assaywatch.outcome.reason"]``. The run's tool inventory (names from
``gen_ai.tool.definitions`` and OpenInference ``llm.tools.<i>.tool.json_schema`` of any
of its spans) is ``Run.attributes["assaywatch.tool_inventory"]``.

Tokens and cost of container steps (nested agents, workflows) are counted only when no LLM
or embedding span lies below them: instrumentations often report the sum of the
children's usage on the container, which would count every token twice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from operator import itemgetter

from assaywatch.analyzers.model import (
    MAX_EVALUATORS,
    TOOL_INVENTORY_ATTRIBUTE,
    UNNAMED_EVALUATOR,
    Action,
    Run,
    Step,
    StreamKey,
)
from assaywatch.monitor.pipeline.dialects import STEP_ROOT_KINDS
from assaywatch.monitor.pipeline.normalize import (
    CONTAINER_KINDS,
    MAX_KEY_VALUE,
    Kind,
    NormalizedSpan,
    share,
)
from assaywatch.monitor.pipeline.outcome import (
    DEFAULT_SCORE_THRESHOLD,
    ContractRules,
    Evaluation,
    decide_outcome,
)
from assaywatch.monitor.receivers.spans import AttrValue, IngestCounters, SpanRecord

#: Characters of an evaluator name kept (it becomes a metric label value).
MAX_EVALUATOR_NAME = 64
#: ``Run.attributes`` key of the oracle's reason.
REASON_KEY = "assaywatch.outcome.reason"
#: ``Run.attributes`` key of the tool inventory: the sorted names of the tools offered to the
#: run's model calls (``gen_ai.tool.definitions``, OpenInference ``llm.tools.<i>.tool.
#: json_schema``), comma-separated, at most :data:`MAX_INVENTORY` names.
INVENTORY_KEY = TOOL_INVENTORY_ATTRIBUTE
MAX_INVENTORY = 64
UNKNOWN_SERVICE = "unknown_service"
_LLMISH = (Kind.LLM, Kind.EMBEDDING)
#: The field order :func:`_make_run` builds steps in (tests/monitor/
#: test_classify_fast_paths.py checks it is ``Step``'s).
STEP_FIELDS = ("action", "tool", "output_length", "error", "input_tokens", "output_tokens",
               "latency_s", "cost_usd", "depth", "start_ns", "span_id", "parent_span_id",
               "name", "model")
_AGENT, _WORKFLOW, _CHAIN, _GENERIC = Kind.AGENT, Kind.WORKFLOW, Kind.CHAIN, Kind.GENERIC


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

    def __init__(self, span: SpanRecord, norm: NormalizedSpan,
                 names: tuple[str | None, str | None] | None = None) -> None:
        """``names``: ``resource_names(span.resource)`` when the caller has it already
        (spans of one resource share it)."""
        self.span_id = span.span_id
        self.parent_id = span.parent_span_id
        name = share(span.name)
        assert name is not None
        self.name = name
        self.start_ns = span.start_ns
        self.end_ns = span.end_ns
        self.norm = norm
        self.service, self.service_version = (
            resource_names(span.resource) if names is None else names)


def resource_names(resource: Mapping[str, AttrValue]) -> tuple[str | None, str | None]:
    """The (shared) ``service.name`` and ``service.version`` of a resource, None when
    absent, empty or not a string."""
    sn, sv = resource.get("service.name"), resource.get("service.version")
    return (share(sn) if isinstance(sn, str) and sn else None,
            share(sv) if isinstance(sv, str) and sv else None)


def _order(n: Node) -> tuple[int, str]:
    return (n.start_ns, n.span_id)


def _entry_order(e: tuple[Node, int]) -> tuple[int, str]:
    """:func:`_order` of a (node, depth) entry, in one call."""
    n = e[0]
    return (n.start_ns, n.span_id)


_depth = itemgetter(1)


class _RunParts:
    """A run being collected: its root, its steps as (node, depth, parent id) entries, and
    the spans that belong to it without being steps (plumbing, the absorbed agent)."""

    __slots__ = ("root", "entries", "hidden", "absorbed", "error_to")
    root: Node
    entries: list[tuple[Node, int, str]]

    def __init__(self, root: Node, absorbed: Node | None = None) -> None:
        self.root = root
        #: (node, depth, nearest enclosing step or root id); depth counts steps only.
        self.entries: list[tuple[Node, int, str]] = []
        #: Plumbing spans and the absorbed agent: their evaluations and tool inventory are
        #: the run's, their error goes to the nearest enclosing step (or the root).
        self.hidden: list[Node] = []
        #: The workflow root's entry agent, whose name the run takes (not a step).
        self.absorbed = absorbed
        self.error_to: set[str] = set()

    def hide(self, node: Node, parent: str) -> None:
        self.hidden.append(node)
        if node.norm.error:
            self.error_to.add(parent or self.root.span_id)


def _under_container(node: Node, nodes: dict[str, Node]) -> bool:
    p = nodes.get(node.parent_id)
    return p is not None and p.norm.kind in CONTAINER_KINDS


def _is_plumbing(node: Node, nodes: dict[str, Node]) -> bool:
    """Framework plumbing: a chain (CHAIN / task / Langfuse chain / execute_task span:
    a LangChain runnable, a LangGraph node or edge) or a LangGraph model node named
    ``agent`` below its graph. Not a step, not a nesting level."""
    s = node.norm
    return s.kind is _CHAIN or (s.graph_node and _under_container(node, nodes))


def _roots_run(node: Node, nodes: dict[str, Node], genai_above: bool) -> bool:
    """Whether ``node``, outside every run so far, starts one: an agent or workflow span
    (not a LangGraph node below its graph), or an outermost chain (no GenAI span above it,
    and not a fragment whose parent never arrived)."""
    s = node.norm
    if s.kind is _CHAIN:
        return not genai_above and (not node.parent_id or node.parent_id in nodes
                                    or s.is_entry)
    return s.is_agent_span and not (s.graph_node and _under_container(node, nodes))


def _entry_agent(root: Node, children: dict[str, list[Node]],
                 nodes: dict[str, Node]) -> Node | None:
    """The first agent span directly below ``root`` (through plumbing), by start time."""
    best: Node | None = None
    stack = list(children.get(root.span_id, ()))
    budget = len(nodes)
    while stack and budget > 0:
        budget -= 1
        c = stack.pop()
        if _is_plumbing(c, nodes):
            stack.extend(children.get(c.span_id, ()))
        elif c.norm.kind is _AGENT and c.norm.is_agent_span and (
                best is None or _order(c) < _order(best)):
            best = c
    return best


def build_runs(trace_id: str, nodes: dict[str, Node], counters: IngestCounters,
               rules: ContractRules | None = None,
               score_threshold: float = DEFAULT_SCORE_THRESHOLD,
               include_generic_steps: bool = False, keep_non_genai: bool = False,
               key_attributes: tuple[str, ...] = ()) -> list[Run]:
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
    if len(tops) == 1:
        # The common trace: one run root with every other span directly below it. The
        # walk below would give this very run; built here without its stack.
        top = tops[0]
        kids = children.get(top.span_id, ())
        if len(kids) == len(nodes) - 1 and _roots_run(top, nodes, False):
            s = top.norm
            run = _RunParts(top, _entry_agent(top, children, nodes)
                            if s.kind is _WORKFLOW and not s.agent_name else None)
            sid = top.span_id
            absorbed = run.absorbed
            for c in reversed(kids):  # the walk's order: last pushed, first taken
                if _is_plumbing(c, nodes) or c is absorbed:
                    run.hide(c, sid)
                else:
                    run.entries.append((c, 1, sid))
            return [_make_run(trace_id, run, nodes, rules, score_threshold,
                              include_generic_steps, key_attributes)]

    runs: list[_RunParts] = []
    # Per top: the nodes outside every run, with depth below the top, the nearest
    # enclosing non-plumbing node's id and whether the node is plumbing.
    outside: dict[str, list[tuple[Node, int, str, bool]]] = {}
    has_run: set[str] = set()
    visited = 0
    for top in tops:
        out: list[tuple[Node, int, str, bool]] = []
        # (node, depth, run, nearest enclosing step id, a GenAI span lies above it)
        stack: list[tuple[Node, int, _RunParts | None, str, bool]] = [
            (top, 0, None, "", False)]
        while stack:
            node, depth, run, parent, genai_above = stack.pop()
            visited += 1
            kids = children.get(node.span_id, ())
            s = node.norm
            if run is None and _roots_run(node, nodes, genai_above):
                run = _RunParts(node, _entry_agent(node, children, nodes)
                                if s.kind is _WORKFLOW and not s.agent_name else None)
                runs.append(run)
                has_run.add(top.span_id)
                for c in kids:
                    stack.append((c, 1, run, node.span_id, True))
                continue
            hide = (s.kind is _CHAIN or (s.graph_node and _under_container(node, nodes))
                    or (run is not None and node is run.absorbed))  # _is_plumbing, inlined
            if run is not None:
                if hide:
                    run.hide(node, parent)
                else:
                    run.entries.append((node, depth, parent))
            else:
                out.append((node, depth, parent, hide))
            if not hide:
                depth, parent = depth + 1, node.span_id
            genai_above = genai_above or s.kind is not _GENERIC
            for c in kids:
                stack.append((c, depth, run, parent, genai_above))
        outside[top.span_id] = out
    if visited < len(nodes):
        counters.add_dropped("span_cycle", len(nodes) - visited)

    if not runs:
        if not keep_non_genai and all(n.norm.kind is _GENERIC for n in nodes.values()):
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
            for node, depth, parent, hide in outside[top.span_id]:
                if node is root:
                    continue
                if hide:
                    main.hide(node, parent)
                else:
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
                stray = sum(not hide and n.norm.kind is not _GENERIC
                            for n, _, _, hide in out)
                if stray:
                    counters.add_dropped("outside_run", stray)
                continue
            host = _host_run(runs, top)
            if host is None:
                counters.add_dropped("orphan_span", len(out))
                continue
            for node, depth, parent, hide in out:
                if hide:
                    host.hide(node, parent)
                else:
                    host.entries.append((node, depth + 1, parent or host.root.span_id))

    return [_make_run(trace_id, r, nodes, rules, score_threshold, include_generic_steps,
                      key_attributes) for r in runs]


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
              include_generic: bool, key_attributes: tuple[str, ...] = ()) -> Run:
    root = parts.root
    rn = root.norm
    # A root that is itself a model or tool call (no agent span wraps it) is the run's
    # first step, at depth 1 as below an agent; whatever it encloses is one level deeper.
    root_is_step = rn.kind in STEP_ROOT_KINDS
    shift = 1 if root_is_step else 0
    # Children before parents (deepest first) to learn which containers hold an LLM call.
    has_llm: set[str] = set()
    for node, _, parent in sorted(parts.entries, key=_depth, reverse=True):  # stable
        if node.norm.kind in _LLMISH or node.span_id in has_llm:
            has_llm.add(parent)
    kept = [(n, d + shift) for n, d, _ in parts.entries
            if include_generic or n.norm.kind is not _GENERIC]
    if root_is_step:
        kept.append((root, 1))
    kept.sort(key=_entry_order)
    error_to = parts.error_to
    steps: list[Step] = []
    evaluations: list[Evaluation] = [] if root_is_step else list(rn.evaluations)
    inventory: set[str] = set(rn.tool_definitions)
    for h in parts.hidden:
        evaluations.extend(h.norm.evaluations)
        inventory.update(h.norm.tool_definitions)
    for n, depth in kept:
        s = n.norm
        aggregate = s.kind in CONTAINER_KINDS and n.span_id in has_llm
        # Positional, in STEP_FIELDS order (half the cost of keywords; one step a span).
        steps.append(Step(
            s.action, s.tool, s.output_length,
            s.error or (n is not root and n.span_id in error_to),
            0 if aggregate else s.input_tokens, 0 if aggregate else s.output_tokens,
            max(0.0, (n.end_ns - n.start_ns) / 1e9), None if aggregate else s.cost_usd,
            depth, n.start_ns, n.span_id, n.parent_id, n.name,
            s.model if s.action is Action.LLM else None))
        evaluations.extend(s.evaluations)
        inventory.update(s.tool_definitions)

    absorbed = parts.absorbed.norm if parts.absorbed is not None else None
    key = StreamKey(
        agent=(rn.agent_name or (absorbed.agent_name if absorbed else None) or root.service
               or UNKNOWN_SERVICE),
        version=(rn.agent_version or (absorbed.agent_version if absorbed else None)
                 or root.service_version or ""),
        scenario=_scenario(root, nodes, [n for n, _ in kept]))
    if key_attributes:
        key = StreamKey(key.agent, key.version,
                        _keyed_scenario(key.scenario, rn, absorbed, steps, key_attributes))
    output_length = rn.output_length
    if output_length <= 0:
        llm_steps = [s for s in steps if s.action is Action.LLM]
        output_length = llm_steps[-1].output_length if llm_steps else 0
    attributes = dict(rn.marks) if rn.marks else {}
    if absorbed is not None and absorbed.marks:
        for k, v in absorbed.marks.items():
            attributes.setdefault(k, v)
    if inventory:
        attributes[INVENTORY_KEY] = ",".join(sorted(inventory)[:MAX_INVENTORY])
    run = Run(trace_id=trace_id, root_span_id=root.span_id, key=key, steps=steps,
              output_length=output_length,
              models=tuple(sorted({s.model for s in steps if s.model})),
              start_ns=root.start_ns, end_ns=root.end_ns,
              error=rn.error or root.span_id in error_to,
              evaluation_score=next((e.score for e in evaluations if e.score is not None),
                                    None),
              attributes=attributes)
    run.scores = scores_of(evaluations)
    run.labels = labels_of(evaluations)
    run.outcome, attributes[REASON_KEY] = decide_outcome(run, evaluations, rules,
                                                         score_threshold)
    return run


def scores_of(evaluations: Iterable[Evaluation]) -> dict[str, float]:
    """Graded scores by evaluator (the mean of one evaluator's scores on the run), at most
    :data:`MAX_EVALUATORS` evaluators, in order of first appearance."""
    sums: dict[str, list[float]] = {}
    for ev in evaluations:
        if ev.score is None or not math.isfinite(ev.score):
            continue
        name = (ev.name or UNNAMED_EVALUATOR)[:MAX_EVALUATOR_NAME]
        if name not in sums and len(sums) >= MAX_EVALUATORS:
            continue
        sums.setdefault(name, []).append(ev.score)
    return {k: sum(v) / len(v) for k, v in sums.items()}


#: Longest label kept (longer ones are cut): labels are categories, not text.
MAX_LABEL_CHARS = 64


def labels_of(evaluations: Iterable[Evaluation]) -> dict[str, str]:
    """Categorical labels by evaluator, of evaluations that carry a label and no score
    (an evaluator that scores is monitored by its scores): the last label of each, at
    most :data:`MAX_EVALUATORS` evaluators, labels cut to :data:`MAX_LABEL_CHARS`."""
    out: dict[str, str] = {}
    for ev in evaluations:
        if ev.score is not None or not ev.label:
            continue
        name = (ev.name or UNNAMED_EVALUATOR)[:MAX_EVALUATOR_NAME]
        if name not in out and len(out) >= MAX_EVALUATORS:
            continue
        out[name] = ev.label[:MAX_LABEL_CHARS]
    return out


#: Key attributes answered by the run's first model call when its root does not carry them.
MODEL_KEYS = ("gen_ai.request.model", "gen_ai.response.model")


def _keyed_scenario(scenario: str, root: NormalizedSpan, absorbed: NormalizedSpan | None,
                    steps: list[Step], key_attributes: tuple[str, ...]) -> str:
    """The scenario with the configured key attributes' values (``streams.key_attributes``):
    ``refund [gen_ai.request.model=gpt-4o-mini, app.tenant=acme]``; an attribute the run's
    root (or its resource) does not carry is left out; a model attribute falls back to the
    run's first model call."""
    values = dict(root.key_values)
    if absorbed is not None:
        for k, v in absorbed.key_values:
            values.setdefault(k, v)
    parts = []
    for k in key_attributes:
        v = values.get(k)
        if v is None and k in MODEL_KEYS:
            v = next((s.model for s in steps if s.model), None)
        if v is not None:
            parts.append(f"{k}={v[:MAX_KEY_VALUE]}")
    if not parts:
        return scenario
    return f"{scenario} [{', '.join(parts)}]" if scenario else f"[{', '.join(parts)}]"
