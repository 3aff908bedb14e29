"""The data model shared by the monitor, the gate and the statistics.

A **Step** is the paper's s_i = (action, tool, output, cost); a **Run** is the paper's
trace tau: one agent invocation, i.e. the subtree under an outermost agent span (see
shared/DESIGN.md "Data model"). The monitor's assembler builds these from spans; the
statistics only ever see these dataclasses, never OpenTelemetry types.

Content never enters the model: a step keeps the *length* of its output, not the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Action(StrEnum):
    """What a step did. ``agent`` is a nested agent invocation, ``handoff`` a transfer."""

    LLM = "llm"
    TOOL = "tool"
    RETRIEVE = "retrieve"
    HANDOFF = "handoff"
    AGENT = "agent"
    OTHER = "other"


class Outcome(StrEnum):
    """The oracle's answer for one run (DESIGN.md "Outcome of a production run")."""

    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"


class Verdict(StrEnum):
    """A three-valued stochastic verdict (SPEC.md 3.3)."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"



#: ``Run.attributes`` key of the tool inventory seen on the wire: the sorted,
#: comma-separated names of the tools offered to the run's model calls
#: (``gen_ai.tool.definitions``, OpenInference ``llm.tools.<i>.tool.json_schema``).
TOOL_INVENTORY_ATTRIBUTE = "assaywatch.tool_inventory"

#: Evaluator name of an evaluation without ``gen_ai.evaluation.name``.
UNNAMED_EVALUATOR = "unnamed"
#: Evaluators kept per run (and per stream in the engine); more are dropped, counted.
MAX_EVALUATORS = 16


@dataclass(frozen=True, slots=True, order=True)
class StreamKey:
    """(agent, version, scenario): the unit every detector and baseline is kept for."""

    agent: str
    version: str = ""
    scenario: str = ""

    def as_labels(self) -> dict[str, str]:
        return {"agent": self.agent, "version": self.version, "scenario": self.scenario}

    def __str__(self) -> str:
        return f"{self.agent}@{self.version or '-'}/{self.scenario or '-'}"


@dataclass(slots=True)
class Step:
    """One step of a run.

    Attributes
    ----------
    action:
        The kind of step.
    tool:
        Tool name for ``tool`` steps (and the target agent for ``handoff``), else None.
    output_length:
        Length of the step's output in characters where known, else its output tokens,
        else 0. Never the content.
    error:
        True when the span reported an error (status ERROR, ``error.type``, an
        ``exception`` event).
    input_tokens, output_tokens:
        Token usage reported on the span (0 when absent).
    latency_s:
        Span duration in seconds (0 when the clocks make it negative).
    cost_usd:
        Money spent where the span reports it, else None.
    depth:
        Nesting depth below the run's root span (the root's direct children have depth 1).
    start_ns:
        Start time in Unix nanoseconds; steps are ordered by (start_ns, span_id).
    span_id, parent_span_id:
        Lowercase hex ids.
    name:
        The span name (for evidence and debugging only; not a fingerprint feature).
    model:
        Response model, else request model, for ``llm`` steps.
    """

    action: Action
    tool: str | None = None
    output_length: int = 0
    error: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float | None = None
    depth: int = 1
    start_ns: int = 0
    span_id: str = ""
    parent_span_id: str = ""
    name: str = ""
    model: str | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(slots=True)
class Run:
    """One agent invocation: the paper's trace tau.

    Attributes
    ----------
    trace_id, root_span_id:
        Lowercase hex ids of the trace and of the run's root span.
    key:
        The stream this run belongs to.
    steps:
        Ordered by (start_ns, span_id); the root span itself is not a step.
    output_length:
        Length of the run's final output (the root span's output, else the last step's).
    outcome:
        Pass / fail / unknown as decided by the oracle.
    models:
        Distinct models used, sorted.
    start_ns, end_ns:
        The root span's start and end in Unix nanoseconds.
    error:
        The root span itself reported an error.
    evaluation_score:
        A recorded evaluation score where the trace carries one.
    scores:
        Graded evaluation scores recorded on the trace, by evaluator
        (``gen_ai.evaluation.name``; :data:`UNNAMED_EVALUATOR` when absent; the mean when
        one evaluator scored the run twice). Late ones (OTLP log events after the run
        closed) reach the engine separately.
    labels:
        Categorical evaluation labels recorded on the trace, by evaluator, for evaluations
        that carry a label and no score (``gen_ai.evaluation.score.label``; the last one
        when an evaluator labelled the run twice).
    attributes:
        Small, bounded, content-free run attributes kept for trace-first checks
        (for example ``assaywatch.relation`` marks of metamorphic pairs).
    """

    trace_id: str
    root_span_id: str
    key: StreamKey
    steps: list[Step] = field(default_factory=list)
    output_length: int = 0
    outcome: Outcome = Outcome.UNKNOWN
    models: tuple[str, ...] = ()
    start_ns: int = 0
    end_ns: int = 0
    error: bool = False
    evaluation_score: float | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        """``<trace_id>:<root_span_id>``, unique per run (a trace may hold several)."""
        return f"{self.trace_id}:{self.root_span_id}"

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.end_ns - self.start_ns) / 1e9)

    @property
    def tools_used(self) -> list[str]:
        return [s.tool for s in self.steps if s.action is Action.TOOL and s.tool]

    @property
    def any_error(self) -> bool:
        return self.error or any(s.error for s in self.steps)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.steps)

    @property
    def decision_path(self) -> tuple[tuple[str, str], ...]:
        """The sequence of (action, tool) pairs: SPEC.md's decision path."""
        return tuple((s.action.value, s.tool or "") for s in self.steps)
