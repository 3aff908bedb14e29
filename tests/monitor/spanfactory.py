"""Build ``SpanRecord``s of a simulated tool-using agent in any tracing dialect.

One *script* (an :class:`Agent` holding :class:`Llm`, :class:`Tool`, :class:`Retrieve`,
:class:`Handoff` and nested :class:`Agent` steps) describes a logical run; a
:class:`SpanFactory` emits it as the spans a given instrumentation would export, so the same
run can be fed to the pipeline in every dialect:

=====================  ===================================================================
``genai``              OpenTelemetry GenAI conventions, current names (``invoke_agent``,
                       ``chat``, ``execute_tool``, ``gen_ai.provider.name``, JSON messages)
``genai_deprecated``   GenAI before v1.37: ``gen_ai.system``, ``prompt_tokens`` /
                       ``completion_tokens``, content in ``gen_ai.content.*`` span events,
                       tools marked by ``gen_ai.tool.name`` only, no agent version
``openinference``      Arize OpenInference: ``openinference.span.kind``, ``llm.*`` flattened
                       messages, ``input.value`` / ``output.value``
``traceloop``          OpenLLMetry decorators: ``<name>.agent`` / ``<name>.tool`` with
                       ``traceloop.span.kind``, ``openai.chat`` with ``llm.request.type``
``langfuse``           Langfuse SDK: ``langfuse.observation.type``, JSON usage/cost details
=====================  ===================================================================

Spans come back in end order (children before parents), as an SDK exporter sends them;
shuffle them in tests. Ids are deterministic for a given ``seed``. Content (``input`` /
``output`` / tool results) is captured when ``capture_content`` is True, as each dialect
captures it, so tests can check that none of it survives into a ``Run``.

Example::

    f = SpanFactory(seed=1)
    spans = f.agent_run(tool_agent(), "openinference")
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from assaywatch.monitor.receivers.spans import STATUS_ERROR, AttrValue, SpanEvent, SpanRecord

DIALECTS = ("genai", "genai_deprecated", "openinference", "traceloop", "langfuse")
INTERNAL, SERVER, CLIENT = 1, 2, 3
MS = 1_000_000


@dataclass
class Llm:
    model: str = "gpt-4o-mini"
    input_tokens: int = 120
    output_tokens: int = 30
    output: str = "Let me look that up."
    provider: str = "openai"
    cost_usd: float | None = None
    error: bool = False
    duration_ms: int = 300


@dataclass
class Tool:
    name: str
    arguments: str = '{"q": "x"}'
    result: str = "ok"
    error: bool = False
    duration_ms: int = 50


@dataclass
class Retrieve:
    source: str = "kb"
    duration_ms: int = 30


@dataclass
class Handoff:
    target: str


@dataclass
class EvalSpec:
    label: str | None = None
    score: float | None = None
    passed: bool | None = None
    name: str = "correctness"
    as_event: bool = False


@dataclass
class Agent:
    name: str = "travel-agent"
    steps: list[Llm | Tool | Retrieve | Handoff | Agent] = field(default_factory=list)
    version: str = "1.0"
    scenario: str = ""
    input: str = "Book me a trip to Paris"
    output: str = "Booked: Paris, 3 nights."
    error: bool = False
    evaluation: EvalSpec | None = None
    tool_definitions: tuple[str, ...] = ()


Step = Llm | Tool | Retrieve | Handoff | Agent


def tool_agent(tools: tuple[str, ...] = ("search_flights", "book_hotel"),
               name: str = "travel-agent", scenario: str = "booking",
               model: str = "gpt-4o-mini") -> Agent:
    """LLM, then (tool, LLM) per tool: 1 + 2 * len(tools) steps."""
    steps: list[Step] = [Llm(model=model, input_tokens=100, output_tokens=20)]
    for i, t in enumerate(tools):
        steps.append(Tool(t, result=f"result of {t}"))
        steps.append(Llm(model=model, input_tokens=150 + 10 * i, output_tokens=25 + i,
                         output=f"after {t}"))
    last = steps[-1]
    assert isinstance(last, Llm)
    last.output = "Booked: Paris, 3 nights."
    return Agent(name=name, steps=steps, scenario=scenario, output=last.output)


def nine_span_agent(name: str = "travel-agent") -> Agent:
    """Root + retrieve + 4 LLM calls + 3 tools: the 9-span run of the benchmarks."""
    a = tool_agent(("search_flights", "search_hotels", "book_hotel"), name=name)
    a.steps.insert(0, Retrieve("policies"))
    return a


class SpanFactory:
    """Emit scripts as spans. ``seed`` fixes the ids; ``start_ns`` the first timestamp."""

    def __init__(self, seed: int = 0, service_name: str = "travel-svc",
                 start_ns: int = 1_700_000_000 * 10**9, capture_content: bool = True,
                 service_version: str | None = None) -> None:
        self._rng = random.Random(seed)
        self.service_name = service_name
        self.service_version = service_version
        self.capture_content = capture_content
        self.clock_ns = start_ns

    def trace_id(self) -> str:
        return f"{self._rng.getrandbits(128) | 1:032x}"

    def span_id(self) -> str:
        return f"{self._rng.getrandbits(64) | 1:016x}"

    def resource(self, version: str = "") -> dict[str, AttrValue]:
        res: dict[str, AttrValue] = {"service.name": self.service_name}
        v = self.service_version if self.service_version is not None else version
        if v:
            res["service.version"] = v
        return res

    # --- public builders -------------------------------------------------------------

    def agent_run(self, agent: Agent, dialect: str, trace_id: str | None = None,
                  parent_span_id: str = "", start_ns: int | None = None) -> list[SpanRecord]:
        """One agent invocation (the run root is the agent span)."""
        _check(dialect)
        tid = trace_id or self.trace_id()
        t0 = self._start(start_ns)
        out: list[SpanRecord] = []
        end = self._emit(agent, dialect, tid, parent_span_id, t0, agent.name,
                         self.resource(agent.version), out)
        self.clock_ns = max(self.clock_ns, end + 10 * MS)
        return out

    def http_request(self, agents: list[Agent], dialect: str, route: str = "/chat",
                     extra_generic: bool = True) -> list[SpanRecord]:
        """An HTTP SERVER root span holding one agent invocation per script, in sequence,
        plus (``extra_generic``) a database span that is no GenAI step."""
        _check(dialect)
        tid, root_id, t0 = self.trace_id(), self.span_id(), self._start(None)
        res = self.resource(agents[0].version if agents else "")
        out: list[SpanRecord] = []
        t = t0 + MS
        if extra_generic:
            out.append(self._record(tid, self.span_id(), root_id, "SELECT users", t, t + 2 * MS,
                                    CLIENT, {"db.system": "postgresql"}, res))
            t += 3 * MS
        for a in agents:
            t = self._emit(a, dialect, tid, root_id, t, a.name, res, out) + MS
        out.append(self._record(tid, root_id, "", f"POST {route}", t0, t + MS, SERVER,
                                {"http.request.method": "POST", "url.path": route}, res))
        self.clock_ns = max(self.clock_ns, t + 10 * MS)
        return out

    def bare_trace(self, steps: list[Step], dialect: str,
                   agent_name: str = "travel-agent") -> list[SpanRecord]:
        """Steps directly under an HTTP SERVER root: a trace with no agent span."""
        _check(dialect)
        tid, root_id, t0 = self.trace_id(), self.span_id(), self._start(None)
        res = self.resource()
        out: list[SpanRecord] = []
        t = t0 + MS
        for s in steps:
            t = self._emit(s, dialect, tid, root_id, t, agent_name, res, out) + MS
        out.append(self._record(tid, root_id, "", "POST /complete", t0, t + MS, SERVER,
                                {"http.request.method": "POST"}, res))
        self.clock_ns = max(self.clock_ns, t + 10 * MS)
        return out

    # --- internals --------------------------------------------------------------------

    def _start(self, start_ns: int | None) -> int:
        return self.clock_ns if start_ns is None else start_ns

    def _record(self, tid: str, sid: str, parent: str, name: str, start: int, end: int,
                kind: int, attrs: dict[str, AttrValue], res: dict[str, AttrValue],
                events: list[SpanEvent] | None = None, error: bool = False,
                scope: str = "") -> SpanRecord:
        return SpanRecord(trace_id=tid, span_id=sid, parent_span_id=parent, name=name,
                          start_ns=start, end_ns=end, kind=kind,
                          status_code=STATUS_ERROR if error else 0, attributes=attrs,
                          events=events or [], resource=res, scope_name=scope)

    def _emit(self, step: Step, dialect: str, tid: str, parent: str, start: int,
              agent_name: str, res: dict[str, AttrValue], out: list[SpanRecord]) -> int:
        """Append the spans of ``step`` (children first) and return its end time."""
        sid = self.span_id()
        events: list[SpanEvent] = []
        if isinstance(step, Agent):
            t = start + MS
            for child in step.steps:
                t = self._emit(child, dialect, tid, sid, t, step.name, res, out) + MS
            end = t
            name, kind, attrs = _agent(step, dialect, self.capture_content)
            ev = step.evaluation
            if ev is not None:
                eattrs: dict[str, AttrValue] = {"gen_ai.evaluation.name": ev.name}
                if ev.label is not None:
                    eattrs["gen_ai.evaluation.score.label"] = ev.label
                if ev.score is not None:
                    eattrs["gen_ai.evaluation.score.value"] = ev.score
                if ev.passed is not None:
                    eattrs["assaywatch.evaluation.passed"] = ev.passed
                if ev.as_event:
                    events.append(SpanEvent("gen_ai.evaluation.result", end, eattrs))
                else:
                    attrs.update(eattrs)
            error = step.error
        elif isinstance(step, Llm):
            end = start + step.duration_ms * MS
            name, kind, attrs = _llm(step, dialect, self.capture_content, events, end)
            error = step.error
        elif isinstance(step, Tool):
            end = start + step.duration_ms * MS
            name, kind, attrs = _tool(step, dialect, self.capture_content)
            error = step.error
        elif isinstance(step, Retrieve):
            end = start + step.duration_ms * MS
            name, kind, attrs = _retrieve(step, dialect)
            error = False
        else:
            end = start + MS
            name, kind, attrs = _handoff(step, dialect, agent_name)
            error = False
        if error:
            if dialect == "langfuse":
                attrs["langfuse.observation.level"] = "ERROR"
            elif dialect.startswith("genai"):
                attrs["error.type"] = "_OTHER"
            else:
                events.append(SpanEvent("exception", end, {"exception.type": "RuntimeError"}))
        out.append(self._record(tid, sid, parent, name, start, end, kind, attrs, res, events,
                                error, "langfuse-sdk" if dialect == "langfuse" else ""))
        return end


def _check(dialect: str) -> None:
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}; use one of {', '.join(DIALECTS)}")


def _messages(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])


Emitted = tuple[str, int, dict[str, AttrValue]]


def _agent(a: Agent, dialect: str, content: bool) -> Emitted:
    attrs: dict[str, AttrValue] = {}
    if a.scenario:
        attrs["assaywatch.scenario"] = a.scenario
    if a.tool_definitions:
        attrs["gen_ai.tool.definitions"] = json.dumps(
            [{"type": "function", "name": t} for t in a.tool_definitions])
    if dialect in ("genai", "genai_deprecated"):
        attrs.update({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": a.name})
        if dialect == "genai":
            attrs.update({"gen_ai.provider.name": "openai", "gen_ai.agent.version": a.version})
            if content:
                attrs["gen_ai.input.messages"] = _messages("user", a.input)
                attrs["gen_ai.output.messages"] = _messages("assistant", a.output)
        else:
            attrs["gen_ai.system"] = "openai"
        return f"invoke_agent {a.name}", INTERNAL, attrs
    if dialect == "openinference":
        attrs.update({"openinference.span.kind": "AGENT", "agent.name": a.name,
                      "graph.node.id": a.name})
        if content:
            attrs.update({"input.value": a.input, "output.value": a.output,
                          "output.mime_type": "text/plain"})
        return a.name, INTERNAL, attrs
    if dialect == "traceloop":
        attrs.update({"traceloop.span.kind": "agent", "traceloop.entity.name": a.name,
                      "traceloop.entity.version": a.version})
        if content:
            attrs["traceloop.entity.input"] = json.dumps({"args": [a.input], "kwargs": {}})
            attrs["traceloop.entity.output"] = json.dumps(a.output)
        return f"{a.name}.agent", INTERNAL, attrs
    attrs.update({"langfuse.observation.type": "agent", "langfuse.version": a.version})
    if content:
        attrs["langfuse.observation.input"] = json.dumps(a.input)
        attrs["langfuse.observation.output"] = json.dumps(a.output)
    return a.name, INTERNAL, attrs


def _llm(s: Llm, dialect: str, content: bool, events: list[SpanEvent], end: int) -> Emitted:
    attrs: dict[str, AttrValue]
    if dialect == "genai":
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": s.provider,
                 "gen_ai.request.model": s.model, "gen_ai.response.model": s.model,
                 "gen_ai.usage.input_tokens": s.input_tokens,
                 "gen_ai.usage.output_tokens": s.output_tokens,
                 "gen_ai.response.finish_reasons": ("stop",)}
        if content:
            attrs["gen_ai.input.messages"] = _messages("user", "prompt")
            attrs["gen_ai.output.messages"] = _messages("assistant", s.output)
        return f"chat {s.model}", CLIENT, attrs
    if dialect == "genai_deprecated":
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.system": s.provider,
                 "gen_ai.request.model": s.model, "gen_ai.response.model": s.model,
                 "gen_ai.usage.prompt_tokens": s.input_tokens,
                 "gen_ai.usage.completion_tokens": s.output_tokens}
        if content:
            events.append(SpanEvent("gen_ai.content.prompt", end,
                                    {"gen_ai.prompt": json.dumps([{"role": "user",
                                                                    "content": "prompt"}])}))
            events.append(SpanEvent("gen_ai.content.completion", end,
                                    {"gen_ai.completion": json.dumps(
                                        [{"role": "assistant", "content": s.output}])}))
        return f"chat {s.model}", CLIENT, attrs
    if dialect == "openinference":
        attrs = {"openinference.span.kind": "LLM", "llm.model_name": s.model,
                 "llm.provider": s.provider, "llm.system": s.provider,
                 "llm.token_count.prompt": s.input_tokens,
                 "llm.token_count.completion": s.output_tokens,
                 "llm.token_count.total": s.input_tokens + s.output_tokens}
        if s.cost_usd is not None:
            attrs["llm.cost.total"] = s.cost_usd
        if content:
            attrs.update({"llm.input_messages.0.message.role": "user",
                          "llm.input_messages.0.message.content": "prompt",
                          "llm.output_messages.0.message.role": "assistant",
                          "llm.output_messages.0.message.content": s.output,
                          "output.value": json.dumps({"id": "resp_1", "output": s.output}),
                          "output.mime_type": "application/json"})
        return "response", CLIENT, attrs
    if dialect == "traceloop":
        attrs = {"llm.request.type": "chat", "gen_ai.system": s.provider,
                 "gen_ai.request.model": s.model, "gen_ai.response.model": s.model,
                 "gen_ai.usage.prompt_tokens": s.input_tokens,
                 "gen_ai.usage.completion_tokens": s.output_tokens,
                 "llm.usage.total_tokens": s.input_tokens + s.output_tokens}
        if content:
            attrs.update({"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "prompt",
                          "gen_ai.completion.0.role": "assistant",
                          "gen_ai.completion.0.content": s.output})
        return f"{s.provider}.chat", CLIENT, attrs
    attrs = {"langfuse.observation.type": "generation",
             "langfuse.observation.model.name": s.model,
             "langfuse.observation.usage_details": json.dumps(
                 {"input": s.input_tokens, "output": s.output_tokens,
                  "total": s.input_tokens + s.output_tokens})}
    if s.cost_usd is not None:
        attrs["langfuse.observation.cost_details"] = json.dumps({"total": s.cost_usd})
    if content:
        attrs["langfuse.observation.input"] = json.dumps([{"role": "user", "content": "p"}])
        attrs["langfuse.observation.output"] = json.dumps({"role": "assistant",
                                                           "content": s.output})
    return f"generation {s.model}", CLIENT, attrs


def _tool(s: Tool, dialect: str, content: bool) -> Emitted:
    attrs: dict[str, AttrValue]
    if dialect in ("genai", "genai_deprecated"):
        attrs = {"gen_ai.tool.name": s.name, "gen_ai.tool.call.id": f"call_{s.name}",
                 "gen_ai.tool.type": "function"}
        if dialect == "genai":
            attrs["gen_ai.operation.name"] = "execute_tool"
        if content:
            attrs["gen_ai.tool.call.arguments"] = s.arguments
            attrs["gen_ai.tool.call.result"] = json.dumps(s.result)
        return f"execute_tool {s.name}", INTERNAL, attrs
    if dialect == "openinference":
        attrs = {"openinference.span.kind": "TOOL", "tool.name": s.name}
        if content:
            attrs.update({"input.value": s.arguments, "output.value": s.result,
                          "output.mime_type": "text/plain"})
        return s.name, INTERNAL, attrs
    if dialect == "traceloop":
        attrs = {"traceloop.span.kind": "tool", "traceloop.entity.name": s.name}
        if content:
            attrs["traceloop.entity.input"] = json.dumps({"args": [s.arguments]})
            attrs["traceloop.entity.output"] = json.dumps(s.result)
        return f"{s.name}.tool", INTERNAL, attrs
    attrs = {"langfuse.observation.type": "tool"}
    if content:
        attrs["langfuse.observation.input"] = s.arguments
        attrs["langfuse.observation.output"] = json.dumps(s.result)
    return s.name, INTERNAL, attrs


def _retrieve(s: Retrieve, dialect: str) -> Emitted:
    if dialect in ("genai", "genai_deprecated"):
        return (f"retrieval {s.source}", CLIENT,
                {"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": s.source})
    if dialect == "openinference":
        return "retrieve", INTERNAL, {"openinference.span.kind": "RETRIEVER"}
    if dialect == "traceloop":
        return (f"vector_db_retrieve {s.source}", CLIENT,
                {"gen_ai.operation.name": "vector_db_retrieve"})
    return f"retrieve {s.source}", INTERNAL, {"langfuse.observation.type": "retriever"}


def _handoff(s: Handoff, dialect: str, source: str) -> Emitted:
    if dialect in ("genai", "genai_deprecated"):
        tool = f"transfer_to_{s.target}"
        return (f"execute_tool {tool}", INTERNAL,
                {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                 "gen_ai.transfer.target.name": s.target})
    if dialect == "openinference":
        return f"handoff to {s.target}", INTERNAL, {"openinference.span.kind": "TOOL"}
    if dialect == "traceloop":
        return f"{source} → {s.target}.handoff", INTERNAL, {"gen_ai.operation.name": "handoff"}
    return f"handoff to {s.target}", INTERNAL, {"langfuse.observation.type": "tool"}
