"""The attribute keys and value tables of every tracing dialect the normalizer reads.

Keys are listed in precedence order (shared/reference/otel-conventions.md section 9); the
value tables map a dialect's span-kind vocabulary to a :class:`Kind`. Unknown values fall
through to the next rule in :func:`assaywatch.monitor.pipeline.normalize.classify`.
"""

from __future__ import annotations

from enum import StrEnum

from assaywatch.analyzers.model import Action


class Kind(StrEnum):
    """What a span is, one step finer than :class:`Action`."""

    LLM = "llm"
    EMBEDDING = "embedding"
    TOOL = "tool"
    RETRIEVE = "retrieve"
    HANDOFF = "handoff"
    AGENT = "agent"
    WORKFLOW = "workflow"
    CHAIN = "chain"
    OTHER = "other"
    #: No GenAI marker at all (HTTP server/client, DB, framework internals).
    GENERIC = "generic"


#: The step action of each kind.
ACTION_OF_KIND: dict[Kind, Action] = {
    Kind.LLM: Action.LLM, Kind.EMBEDDING: Action.RETRIEVE, Kind.TOOL: Action.TOOL,
    Kind.RETRIEVE: Action.RETRIEVE, Kind.HANDOFF: Action.HANDOFF, Kind.AGENT: Action.AGENT,
    Kind.WORKFLOW: Action.OTHER, Kind.CHAIN: Action.OTHER, Kind.OTHER: Action.OTHER,
    Kind.GENERIC: Action.OTHER,
}
#: Kinds whose usage/cost is usually the sum of their children's (see the assembler).
CONTAINER_KINDS = frozenset({Kind.AGENT, Kind.WORKFLOW, Kind.CHAIN})
#: Kinds of a run root that is itself a step (a trace whose root is the model call or the
#: tool call: no agent span wraps it, yet its model, tokens, tool and error are the run's).
STEP_ROOT_KINDS = frozenset({Kind.LLM, Kind.EMBEDDING, Kind.TOOL, Kind.RETRIEVE,
                             Kind.HANDOFF})
#: OpenInference AGENT span names that are LangGraph graph nodes, not agents: OpenInference
#: marks every runnable whose name contains "agent" as AGENT, and the ReAct graph's model
#: node (``create_react_agent``, the LangGraph tutorials) is named ``agent``. Below a
#: container span (the graph) such a span is plumbing of the graph's agent (runs.py).
GRAPH_NODE_NAMES = frozenset({"agent"})
#: OpenInference's flattened tool inventory of an LLM span: ``llm.tools.<i>.tool.json_schema``.
OI_TOOLS_PREFIX, OI_TOOLS_SUFFIX = "llm.tools.", ".tool.json_schema"
OI_FIRST_TOOL_KEY = f"{OI_TOOLS_PREFIX}0{OI_TOOLS_SUFFIX}"
MAX_TOOL_DEFINITIONS = 256

K = Kind
OPERATION_KINDS: dict[str, Kind] = {
    "chat": K.LLM, "text_completion": K.LLM, "generate_content": K.LLM, "completion": K.LLM,
    "generate": K.LLM, "llm_request": K.LLM, "embeddings": K.EMBEDDING,
    "embedding": K.EMBEDDING, "retrieval": K.RETRIEVE, "search_memory": K.RETRIEVE,
    "vector_db_retrieve": K.RETRIEVE, "execute_tool": K.TOOL, "invoke_agent": K.AGENT,
    "create_agent": K.AGENT, "invoke_workflow": K.WORKFLOW, "handoff": K.HANDOFF,
    "execute_task": K.CHAIN, "plan": K.OTHER, "create_memory": K.OTHER,
    "create_memory_store": K.OTHER, "update_memory": K.OTHER, "upsert_memory": K.OTHER,
    "delete_memory": K.OTHER, "delete_memory_store": K.OTHER,
}
OPENINFERENCE_KINDS: dict[str, Kind] = {
    "LLM": K.LLM, "EMBEDDING": K.EMBEDDING, "CHAIN": K.CHAIN, "RETRIEVER": K.RETRIEVE,
    "TOOL": K.TOOL, "AGENT": K.AGENT, "RERANKER": K.OTHER, "GUARDRAIL": K.OTHER,
    "EVALUATOR": K.OTHER, "PROMPT": K.OTHER, "DECISION": K.OTHER,
}
TRACELOOP_KINDS: dict[str, Kind] = {
    "workflow": K.WORKFLOW, "task": K.CHAIN, "agent": K.AGENT, "tool": K.TOOL,
    "handoff": K.HANDOFF,
}
LANGFUSE_KINDS: dict[str, Kind] = {
    "generation": K.LLM, "embedding": K.EMBEDDING, "agent": K.AGENT, "tool": K.TOOL,
    "chain": K.CHAIN, "retriever": K.RETRIEVE, "evaluator": K.OTHER, "guardrail": K.OTHER,
    "span": K.OTHER, "event": K.OTHER,
}
LLM_REQUEST_KINDS: dict[str, Kind] = {
    "chat": K.LLM, "completion": K.LLM, "embedding": K.EMBEDDING, "rerank": K.OTHER,
}
#: Traceloop provider spans are named ``<provider>.<call>``.
PROVIDER_SPAN_PREFIXES = frozenset({
    "openai", "anthropic", "cohere", "bedrock", "mistralai", "groq", "gemini", "vertexai",
    "ollama", "together", "watsonx", "replicate", "sagemaker", "alephalpha", "writer",
})
PROVIDER_SPAN_SUFFIXES: dict[str, Kind] = {
    "chat": K.LLM, "completion": K.LLM, "response": K.LLM, "embeddings": K.EMBEDDING,
}
#: Deprecated ``gen_ai.system`` values and their ``gen_ai.provider.name`` successors.
PROVIDER_RENAMES = {
    "az.ai.inference": "azure.ai.inference", "az.ai.openai": "azure.ai.openai",
    "vertex_ai": "gcp.vertex_ai", "gemini": "gcp.gemini", "xai": "x_ai",
}

MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "llm.response.model_name",
              "llm.model_name", "llm.request.model_name", "langfuse.observation.model.name",
              "embedding.model_name")
PROVIDER_KEYS = ("gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")
INPUT_TOKEN_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens",
                    "llm.token_count.prompt", "langfuse.observation.usage_details.input")
OUTPUT_TOKEN_KEYS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
                     "llm.token_count.completion", "langfuse.observation.usage_details.output")
COST_KEYS = ("llm.cost.total", "gen_ai.usage.cost")
SCENARIO_KEYS = ("assaywatch.scenario", "gen_ai.workflow.name", "traceloop.workflow.name")
#: Character length of the output, recorded by assaywatch's own instrumentation.
OUTPUT_LENGTH_KEY = "assaywatch.output.length"
#: Content attributes whose character length is the output length (never the text).
OUTPUT_CONTENT_KEYS = ("gen_ai.output.messages", "traceloop.entity.output",
                       "langfuse.observation.output", "gen_ai.tool.call.result")
ERROR_EVENTS = frozenset({"exception", "gen_ai.client.operation.exception"})
EVALUATION_EVENT = "gen_ai.evaluation.result"
#: Run-root attributes under this prefix are kept on ``Run.attributes`` (bounded).
MARK_PREFIX = "assaywatch."
MARK_SKIP = frozenset({"assaywatch.scenario", "assaywatch.evaluation.passed",
                       OUTPUT_LENGTH_KEY})
MAX_MARKS, MAX_MARK_CHARS = 16, 256
SERVER_KINDS = (2, 5)  # SERVER, CONSUMER: entry points whose parent may be remote

#: Every attribute key the pipeline reads (span, event and resource attributes): the
#: monitor's receivers decode only these (``DecodeLimits.keep_keys``), plus the keys
#: starting with :data:`READ_PREFIXES`. A key read by normalize.py or runs.py must be
#: listed here (tests/monitor/test_read_keys.py checks it on every dialect).
READ_KEYS: frozenset[str] = frozenset({
    "gen_ai.operation.name", "openinference.span.kind", "traceloop.span.kind",
    "langfuse.observation.type", "llm.request.type", "mcp.method.name", "gen_ai.tool.name",
    "gen_ai.tool.call.id", "tool.name", "traceloop.entity.name",
    "gen_ai.transfer.target.name", "gen_ai.agent.name", "agent.name", "gen_ai.agent.version",
    "traceloop.entity.version", "langfuse.version", "langfuse.observation.usage_details",
    "langfuse.observation.cost_details", "gen_ai.output.messages", "output.value",
    "output.mime_type", "error.type", "langfuse.observation.level",
    "gen_ai.evaluation.score.label", "gen_ai.evaluation.score.value",
    "gen_ai.evaluation.name", "gen_ai.tool.definitions", "gen_ai.completion",
    "service.name", "service.version",
    *MODEL_KEYS, *PROVIDER_KEYS, *INPUT_TOKEN_KEYS, *OUTPUT_TOKEN_KEYS, *COST_KEYS,
    *SCENARIO_KEYS, *OUTPUT_CONTENT_KEYS, OUTPUT_LENGTH_KEY, *MARK_SKIP,
})
#: Key prefixes the pipeline reads: run marks, the flattened (indexed) output messages and
#: OpenInference's flattened tool inventory.
READ_PREFIXES: tuple[str, ...] = (MARK_PREFIX, "llm.output_messages.", "gen_ai.completion.",
                                  OI_TOOLS_PREFIX)
