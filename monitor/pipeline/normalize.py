"""Normalize one span of any tracing dialect into the content-free facts the assembler needs.

Dialects read (shared/reference/otel-conventions.md section 9, keys in that precedence):
OpenTelemetry GenAI (current and deprecated names), OpenInference, OpenLLMetry/Traceloop
and Langfuse. :func:`classify` is on the hot path: it does a bounded number of dict
look-ups per span and one pass over the span's events, no regex and no scan of all
attribute keys (except on possible run roots, for the few ``assaywatch.*`` marks).

Kind of a span, first rule that matches wins:

1. ``gen_ai.operation.name`` (:data:`OPERATION_KINDS`; unknown custom values fall through),
2. ``openinference.span.kind``, 3. ``traceloop.span.kind``, 4. ``langfuse.observation.type``,
5. ``llm.request.type``, 6. MCP ``mcp.method.name == "tools/call"``,
7. ``gen_ai.tool.name`` or ``gen_ai.tool.call.id`` present -> tool,
8. a Traceloop provider span name (``openai.chat``, ``anthropic.completion``, ...),
9. a model key present -> llm; else ``other`` when some dialect key was present, else
   ``generic`` (an HTTP, database or framework span carrying no GenAI meaning).

Decisions (documented because they shape the fingerprint):

- **Embeddings -> retrieve.** An embedding call produces a vector, not an answer: in agents
  it is the query-encoding half of retrieval. Counting it as ``llm`` would inflate the llm
  step count and mix vector "outputs" into output length. Its model is kept on the step
  but it does not count in ``Run.models`` (llm steps only).
- **Workflows root runs.** ``invoke_workflow`` and Traceloop ``workflow`` spans are agent
  spans in the DESIGN.md sense (Traceloop's openai-agents root is a workflow span, so is
  the GenAI openai-agents root): they can root a run; nested below a run they are ``other``
  steps. ``CHAIN`` / ``task`` / Langfuse ``chain`` root a run only when outermost (a
  LangGraph graph with no agent span); below a run root they are plumbing, not steps
  (LangChain emits one per runnable; runs.py).
- **OpenInference agent names.** An ``AGENT`` span without ``agent.name`` is named after
  the span (``@tracer.agent``, a LangGraph graph compiled with a name). OpenInference marks
  every LangChain runnable whose name contains "agent" as ``AGENT``: a span named exactly
  ``agent`` is flagged ``graph_node`` (LangGraph's ReAct model node), and runs.py treats it
  as plumbing below a container span.
- **Tool inventory**: ``gen_ai.tool.definitions``, else on OpenInference LLM spans the
  flattened ``llm.tools.<i>.tool.json_schema``; names only, parsed once per distinct text.
- **create_agent** is an agent-kind step (as the cheat-sheet lists it) but never roots a
  run: it configures an agent, it does not invoke one.
- **Handoffs**: ``gen_ai.operation.name=handoff``, Traceloop ``handoff``, an
  ``execute_tool`` carrying ``gen_ai.transfer.target.name``, and tool spans named
  ``handoff to X`` (OpenInference, Langfuse) or tools named ``transfer_to_X`` (the
  openai-agents handoff tool). The step's tool is the target agent.
"""

from __future__ import annotations

from collections.abc import Iterable, KeysView, Mapping
from dataclasses import dataclass, field

from assaywatch.analyzers.model import Action
from assaywatch.monitor.pipeline.dialects import (
    ACTION_OF_KIND,
    CONTAINER_KINDS,
    ERROR_EVENTS,
    EVALUATION_EVENT,
    GRAPH_NODE_NAMES,
    INPUT_TOKEN_KEYS,
    LANGFUSE_KINDS,
    LLM_REQUEST_KINDS,
    MARK_PREFIX,
    MARK_SKIP,
    MAX_MARK_CHARS,
    MAX_MARKS,
    MODEL_KEYS,
    OI_FIRST_TOOL_KEY,
    OPENINFERENCE_KINDS,
    OPERATION_KINDS,
    OUTPUT_TOKEN_KEYS,
    PROVIDER_KEYS,
    PROVIDER_RENAMES,
    PROVIDER_SPAN_PREFIXES,
    PROVIDER_SPAN_SUFFIXES,
    READ_KEYS,
    READ_PREFIXES,
    SCENARIO_KEYS,
    SERVER_KINDS,
    TRACELOOP_KINDS,
    Kind,
)
from assaywatch.monitor.pipeline.outcome import Evaluation
from assaywatch.monitor.pipeline.values import (
    COST_SOURCES,
    EVALUATION_SOURCES,
    OUTPUT_LENGTH_SOURCES,
    as_int,
    as_json,
    as_str,
    cost_of,
    evaluation_of,
    first_value,
    openinference_tools_of,
    output_length_of,
    text_length,
    tool_definitions_of,
    usage_detail,
)
from assaywatch.monitor.receivers.otlp.decode import DecodeLimits
from assaywatch.monitor.receivers.spans import STATUS_ERROR, AttrValue, SpanRecord

__all__ = ["CONTAINER_KINDS", "Kind", "NormalizedSpan", "classify", "native_classify_context",
           "text_length"]


@dataclass(slots=True)
class NormalizedSpan:
    """The content-free facts of one span. Counts and names only, never message text."""

    kind: Kind
    action: Action
    #: Can root a run (invoke_agent, AGENT, Traceloop agent/workflow, invoke_workflow, ...).
    is_agent_span: bool
    #: A SERVER/CONSUMER span: its parent may legitimately live in another service.
    is_entry: bool
    tool: str | None = None
    #: Agent name and version are read on possible run roots only (agent, entry and
    #: parentless spans): the stream key comes from the run root.
    agent_name: str | None = None
    agent_version: str | None = None
    scenario: str | None = None
    model: str | None = None
    provider: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    #: Characters of the output content where captured, else output tokens.
    output_length: int = 0
    error: bool = False
    evaluations: tuple[Evaluation, ...] = ()
    tool_definitions: tuple[str, ...] = ()
    marks: dict[str, str] | None = None
    #: Values of the configured stream key attributes (``streams.key_attributes``) found
    #: on a possible run root or its resource: (attribute, value) pairs
    key_values: tuple[tuple[str, str], ...] = ()
    #: An OpenInference AGENT span named like a LangGraph model node (``agent``): below a
    #: container span it is the graph's plumbing, not an agent (runs.py decides).
    graph_node: bool = False
    #: The estimated bytes of the values above a pending span keeps
    #: (``assemble.kept_bytes``), -1 until first needed (the compiled decoder's classifier
    #: fills it in). Derived, so not compared.
    nbytes: int = field(default=-1, compare=False, repr=False)


MAX_SHARED = 8_192
#: Characters of a stream key attribute's value kept (it becomes part of a label value).
MAX_KEY_VALUE = 64


class _Shared(dict[str | None, str | None]):
    """Bounded table of shared strings: ``table[s]`` is the first object seen equal to s."""

    def __missing__(self, s: str | None) -> str | None:
        if len(self) < MAX_SHARED:
            self[s] = s
        return s


_SHARED = _Shared()
#: ``share(s)``: one object per distinct value for the repeated names a pending span keeps.
#: Span names, models, providers, tools and agent names repeat across spans, yet the
#: decoder makes a new ``str`` for each span (~60 bytes each); a pending trace holding the
#: shared object instead keeps ~150 bytes less per span. The table is bounded
#: (:data:`MAX_SHARED` values, first come): values past it are kept as they are, so memory
#: stays bounded whatever the producer sends. A C-level dict look-up (no Python call on a
#: hit), cheap enough for the hot path; ``share(None)`` is None.
share = _SHARED.__getitem__


#: Module-level aliases of the kinds ``classify`` compares with: a global look-up costs a
#: fraction of an ``Enum`` class attribute look-up (hot path).
_LLM, _TOOL, _HANDOFF, _AGENT = Kind.LLM, Kind.TOOL, Kind.HANDOFF, Kind.AGENT
_WORKFLOW, _CHAIN, _OTHER, _GENERIC = Kind.WORKFLOW, Kind.CHAIN, Kind.OTHER, Kind.GENERIC
_OI_KIND = "openinference.span.kind"


def _kind(span: SpanRecord, attrs: Mapping[str, AttrValue]) -> tuple[Kind, str | None]:
    """(kind, which dialect key decided it) in the precedence of the module docstring."""
    marked = False
    for key, table in (("gen_ai.operation.name", OPERATION_KINDS),
                       ("openinference.span.kind", OPENINFERENCE_KINDS),
                       ("traceloop.span.kind", TRACELOOP_KINDS),
                       ("langfuse.observation.type", LANGFUSE_KINDS),
                       ("llm.request.type", LLM_REQUEST_KINDS)):
        v = attrs.get(key)
        if v is not None:
            marked = True
            kind = table.get(v) if isinstance(v, str) else None
            if kind is not None:
                return kind, key
    if attrs.get("mcp.method.name") == "tools/call":
        return _TOOL, "mcp.method.name"
    if "gen_ai.tool.name" in attrs or "gen_ai.tool.call.id" in attrs:
        return _TOOL, "gen_ai.tool.name"
    prefix, dot, suffix = span.name.partition(".")
    if dot and prefix in PROVIDER_SPAN_PREFIXES:
        kind = PROVIDER_SPAN_SUFFIXES.get(suffix)
        if kind is not None:
            return kind, "span.name"
    if first_value(attrs, MODEL_KEYS) is not None:
        return _LLM, "model"
    return (_OTHER if marked else _GENERIC), None


def _tool_name(span: SpanRecord, attrs: Mapping[str, AttrValue], by: str | None) -> str | None:
    name = as_str(first_value(attrs, ("gen_ai.tool.name", "tool.name")))
    if name is None and attrs.get("traceloop.span.kind") == "tool":
        name = as_str(attrs.get("traceloop.entity.name"))
    if name is None and by == "mcp.method.name":
        name = span.name.partition(" ")[2] or None
    if name is None and by in ("openinference.span.kind", "langfuse.observation.type"):
        name = span.name or None  # both name tool spans after the tool
    return name


def _handoff_target(span: SpanRecord, attrs: Mapping[str, AttrValue],
                    tool: str | None) -> str | None:
    target = as_str(attrs.get("gen_ai.transfer.target.name"))
    if target is not None:
        return target
    name = span.name
    if name.startswith("handoff to "):
        return name[len("handoff to "):] or None
    if name.endswith(".handoff"):  # Traceloop: "<from> → <to>.handoff"
        return name[: -len(".handoff")].rpartition("→")[2].strip() or None
    if tool is not None and tool.startswith("transfer_to_"):
        return tool[len("transfer_to_"):] or None
    return tool


#: Key sets of the look-ups ``classify`` skips when a span carries none of their keys: one
#: C-level ``isdisjoint`` on the span's keys instead of a call and a look-up per key.
_PROVIDER_SET = frozenset(PROVIDER_KEYS)
_MODEL_SET = frozenset(MODEL_KEYS)
_INPUT_SET = frozenset(INPUT_TOKEN_KEYS)
_OUTPUT_SET = frozenset(OUTPUT_TOKEN_KEYS)
_SCENARIO_SET = frozenset(SCENARIO_KEYS)
_USAGE_DETAILS = "langfuse.observation.usage_details"


def _str_at(attrs: Mapping[str, AttrValue], present: KeysView[str], keys: tuple[str, ...],
            keyset: frozenset[str]) -> str | None:
    """``as_str(first_value(attrs, keys))``; ``present`` is ``attrs.keys()`` and ``keyset``
    the set of ``keys``. A non-empty string under the first key is the answer at once."""
    v = attrs.get(keys[0])
    if v.__class__ is str and v:
        return v  # type: ignore[return-value]
    if present.isdisjoint(keyset):
        return None
    return as_str(first_value(attrs, keys))


def _tokens(attrs: Mapping[str, AttrValue], present: KeysView[str], keys: tuple[str, ...],
            keyset: frozenset[str], detail: str) -> int:
    """Token count under ``keys`` (first present wins), else Langfuse's usage details."""
    v = attrs.get(keys[0])
    if v.__class__ is int:
        return v if v > 0 else 0  # type: ignore[operator,return-value]
    if not present.isdisjoint(keyset):
        v = first_value(attrs, keys)
        if v is not None:
            return as_int(v)
    return usage_detail(attrs, detail) if _USAGE_DETAILS in present else 0


def classify(span: SpanRecord, key_attributes: tuple[str, ...] = ()) -> NormalizedSpan:
    """Normalize one span. Pure, content-free, never keeps a reference to the span.
    ``key_attributes``: extra stream key attributes read on possible run roots."""
    attrs = span.attributes
    present = attrs.keys()
    op = attrs.get("gen_ai.operation.name")
    kind = OPERATION_KINDS.get(op) if op.__class__ is str else None  # type: ignore[arg-type]
    if kind is not None:  # the GenAI conventions' key decides most spans: rule 1 at once
        by: str | None = "gen_ai.operation.name"
    else:
        kind, by = _kind(span, attrs)
    tool: str | None = None
    if kind is _TOOL:
        v = attrs.get("gen_ai.tool.name")
        tool = v if v.__class__ is str and v else _tool_name(span, attrs, by)  # type: ignore[assignment]
        if ("gen_ai.transfer.target.name" in attrs or span.name.startswith("handoff to ")
                or (tool is not None and tool.startswith("transfer_to_"))):  # a handoff
            kind = _HANDOFF
            tool = _handoff_target(span, attrs, tool)
    elif kind is _HANDOFF:
        tool = _handoff_target(span, attrs, as_str(attrs.get("gen_ai.tool.name")))
    is_agent = (kind is _WORKFLOW or kind is _AGENT) and (
        attrs.get("gen_ai.operation.name") != "create_agent")
    is_entry = span.kind in SERVER_KINDS
    # An outermost chain roots a run when no agent span encloses it (runs.py).
    may_root = is_agent or kind is _CHAIN or is_entry or not span.parent_span_id
    graph_node = (kind is _AGENT and by == _OI_KIND
                  and span.name in GRAPH_NODE_NAMES)

    agent_name = version = None
    if may_root:  # the stream key is read from run roots only
        tl_kind = attrs.get("traceloop.span.kind")
        lf_type = attrs.get("langfuse.observation.type")
        agent_name = as_str(first_value(attrs, ("gen_ai.agent.name", "agent.name")))
        if agent_name is None and kind is _AGENT:
            if tl_kind == "agent":
                agent_name = as_str(attrs.get("traceloop.entity.name"))
            elif lf_type == "agent" or by == _OI_KIND:
                # Langfuse names agent observations after the agent; so do OpenInference's
                # ``@tracer.agent`` and LangChain/LangGraph (the runnable's, the graph's name).
                agent_name = span.name or None
        version = as_str(attrs.get("gen_ai.agent.version"))
        if version is None and is_agent:
            if tl_kind in ("agent", "workflow"):
                version = as_str(attrs.get("traceloop.entity.version"))
            elif lf_type == "agent":
                version = as_str(attrs.get("langfuse.version"))

    provider = model = None
    in_tok = out_tok = 0
    cost: float | None = None
    out_len: int | None = None
    if kind is not _GENERIC:  # HTTP/DB spans carry no usage: skip the look-ups
        provider = _str_at(attrs, present, PROVIDER_KEYS, _PROVIDER_SET)
        if provider is not None:
            provider = PROVIDER_RENAMES.get(provider, provider)
        model = _str_at(attrs, present, MODEL_KEYS, _MODEL_SET)
        in_tok = _tokens(attrs, present, INPUT_TOKEN_KEYS, _INPUT_SET, "input")
        out_tok = _tokens(attrs, present, OUTPUT_TOKEN_KEYS, _OUTPUT_SET, "output")
        # each is None when the span carries none of the keys it reads
        cost = None if present.isdisjoint(COST_SOURCES) else cost_of(attrs)
        out_len = None if present.isdisjoint(OUTPUT_LENGTH_SOURCES) else output_length_of(attrs)

    error = span.status_code == STATUS_ERROR or "error.type" in attrs or (
        attrs.get("langfuse.observation.level") == "ERROR")
    ev = None if present.isdisjoint(EVALUATION_SOURCES) else evaluation_of(attrs)
    evaluations = [ev] if ev is not None else []
    for event in span.events:
        name = event.name
        if name in ERROR_EVENTS:
            error = True
        elif name == EVALUATION_EVENT:
            ev = evaluation_of(event.attributes)
            if ev is not None and ev not in evaluations:  # the same one as attribute + event
                evaluations.append(ev)
        elif name == "gen_ai.content.completion" and out_len is None:  # semconv <= 1.26
            c = event.attributes.get("gen_ai.completion")
            if c is not None:
                out_len = text_length(as_json(c))

    defs = attrs.get("gen_ai.tool.definitions")
    if defs is not None:
        tool_defs = tool_definitions_of(defs)
    elif by == _OI_KIND and kind is _LLM and OI_FIRST_TOOL_KEY in attrs:
        tool_defs = openinference_tools_of(attrs)
    else:
        tool_defs = ()
    marks: dict[str, str] | None = None
    if may_root:
        for k, mv in attrs.items():
            if k.startswith(MARK_PREFIX) and k not in MARK_SKIP:
                if marks is None:
                    marks = {}
                if len(marks) < MAX_MARKS:
                    marks[k] = str(mv)[:MAX_MARK_CHARS]
    key_values: tuple[tuple[str, str], ...] = ()
    if may_root and key_attributes:
        found = []
        for k in key_attributes:
            kv = attrs.get(k)
            if kv is None:
                kv = span.resource.get(k)
            if kv is not None and not isinstance(kv, (bytes, dict, tuple)):
                found.append((k, str(share(str(kv)[:MAX_KEY_VALUE]))))
        key_values = tuple(found)
    # Positional, in NormalizedSpan's field order: cheaper than keywords on the hot path.
    return NormalizedSpan(
        kind, ACTION_OF_KIND[kind], is_agent, is_entry, share(tool), share(agent_name),
        share(version), share(_str_at(attrs, present, SCENARIO_KEYS, _SCENARIO_SET)),
        share(model), share(provider), in_tok, out_tok, cost,
        out_len if out_len is not None else out_tok, error, tuple(evaluations), tool_defs,
        marks, key_values, graph_node)


#: Keys the common case reads (``native_classify_context``) and keys it may ignore: the
#: ids of a tool call and ``tool.name`` (read only when ``gen_ai.tool.name`` is not a
#: non-empty string, a span the common case leaves to ``classify``), the resource's names.
_NATIVE_IGNORED = ("gen_ai.tool.call.id", "tool.name", "service.name", "service.version")
#: The evaluation keys ``values.evaluation_of`` reads (name, label, score, pass flag), in
#: the order the compiled classifier takes them: an evaluation given as attributes (not as
#: an event) with a numeric score and a bool flag is read while decoding.
_NATIVE_EVALUATION_KEYS = ("gen_ai.evaluation.name", "gen_ai.evaluation.score.label",
                           "gen_ai.evaluation.score.value", "assaywatch.evaluation.passed")
#: Estimated bytes of one entry of a pending span's evaluations, tool definitions or run
#: marks (``assemble.kept_bytes``; an evaluation counts two).
ENTRY_BYTES = 100


def native_classify_context() -> dict[str, object]:
    """The tables with which the compiled decoder (native/src/classify.rs) classifies the
    common GenAI span while decoding, building the :class:`NormalizedSpan` :func:`classify`
    would (``SpanRecord.norm``; the assembler calls :func:`classify` on the others).

    The common case: ``gen_ai.operation.name`` in :data:`OPERATION_KINDS` decides the kind
    (rule 1) and it is not a handoff; no event; the names under the agent, version, model,
    provider and scenario keys are strings (or absent) and the token counts integers; an
    evaluation given as attributes has a numeric (or no) score, a bool (or no) pass flag
    and a string or integer (or no) name and label; a
    tool span's ``gen_ai.tool.name`` is a non-empty string, not ``transfer_to_...``, on a
    span not named ``handoff to ...``; and the span carries none of ``complex_keys`` or
    ``complex_prefixes``: every other key :data:`READ_KEYS` lists (evaluations, costs,
    output content and length, tool definitions, run marks, errors, other dialects' kinds,
    handoff targets, Langfuse details). Stream key attributes are not read there: with
    ``streams.key_attributes`` set, the assembler classifies every span itself.
    ``tests/monitor/test_native_decode.py`` checks the decoder's answer equals
    :func:`classify` on generated spans.
    """
    simple = {"gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.agent.name", "agent.name",
              "gen_ai.agent.version", *MODEL_KEYS, *PROVIDER_KEYS, *INPUT_TOKEN_KEYS,
              *OUTPUT_TOKEN_KEYS, *SCENARIO_KEYS, *_NATIVE_IGNORED, *_NATIVE_EVALUATION_KEYS}
    return {
        "op_key": "gen_ai.operation.name", "tool_key": "gen_ai.tool.name",
        "agent_keys": ["gen_ai.agent.name", "agent.name"],
        "version_keys": ["gen_ai.agent.version"],
        "model_keys": list(MODEL_KEYS), "provider_keys": list(PROVIDER_KEYS),
        "input_keys": list(INPUT_TOKEN_KEYS), "output_keys": list(OUTPUT_TOKEN_KEYS),
        "scenario_keys": list(SCENARIO_KEYS), "ignored_keys": list(_NATIVE_IGNORED),
        "complex_keys": sorted(READ_KEYS - simple), "complex_prefixes": list(READ_PREFIXES),
        "op_kinds": {op: (kind, ACTION_OF_KIND[kind], kind.value)
                     for op, kind in OPERATION_KINDS.items()},
        "provider_renames": dict(PROVIDER_RENAMES),
        "normalized_span": NormalizedSpan, "share": share,
        "evaluation_keys": list(_NATIVE_EVALUATION_KEYS), "evaluation": Evaluation,
        "evaluation_bytes": 2 * ENTRY_BYTES,
    }


def monitor_decode_limits(key_attributes: Iterable[str] = (),
                          classified_attributes: bool = True) -> DecodeLimits:
    """The decode limits of the monitor's receivers: only the attributes the pipeline
    reads (:data:`READ_KEYS`, :data:`READ_PREFIXES` and the stream key attributes) are
    converted, the rest is skipped before its value is read; and, with no stream key
    attributes (which the compiled decoder does not read), the common span is classified
    while decoding (:func:`native_classify_context`). ``classified_attributes=False``: a
    span classified while decoding keeps no attributes (its ``norm`` holds what the
    pipeline reads), for a monitor without a write-ahead log to replay them from."""
    keys = frozenset(key_attributes)
    return DecodeLimits(keep_keys=READ_KEYS | keys, keep_prefixes=READ_PREFIXES,
                        classify=None if keys else native_classify_context,
                        classified_attributes=classified_attributes)
