"""Span attribute and environment variable names used by the instrumentation.

The GenAI names follow the OpenTelemetry GenAI semantic conventions (moved to
``open-telemetry/semantic-conventions-genai`` in v1.42; see
shared/reference/otel-conventions.md section 1). They are spelled out here instead of
imported from ``opentelemetry.semconv._incubating`` because those constants are marked
as moved and calling their enums warns; the strings are the contract the monitor reads.

The ``assaywatch.*`` names are ours. They are content-free: lengths and keys, never text.
"""

from __future__ import annotations

# --- GenAI semantic conventions ---------------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_AGENT_VERSION = "gen_ai.agent.version"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
GEN_AI_EVALUATION_NAME = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_RESULT_EVENT = "gen_ai.evaluation.result"
ERROR_TYPE = "error.type"

OP_INVOKE_AGENT = "invoke_agent"
OP_EXECUTE_TOOL = "execute_tool"
OP_CHAT = "chat"

#: Attributes whose values are message, prompt or tool-argument content. They appear only
#: when the user opts in with :data:`ENV_CAPTURE_CONTENT`.
CONTENT_ATTRIBUTES = frozenset(
    {
        GEN_AI_INPUT_MESSAGES,
        GEN_AI_OUTPUT_MESSAGES,
        GEN_AI_SYSTEM_INSTRUCTIONS,
        GEN_AI_TOOL_CALL_ARGUMENTS,
        GEN_AI_TOOL_CALL_RESULT,
    }
)

# --- assaywatch ---------------------------------------------------------------------------
#: The scenario part of the stream key (agent, version, scenario): a low-cardinality name
#: for the kind of task the run serves (for example ``"refund"``), set on the agent span.
SCENARIO = "assaywatch.scenario"
#: Character length of the span's output: the final answer's text on ``invoke_agent``
#: spans, ``str(result)`` on ``execute_tool`` spans, the text of the output messages (plus
#: tool-call argument strings) on ``chat`` spans. Always recorded, with or without content
#: capture: the fingerprint needs lengths, never text.
OUTPUT_LENGTH = "assaywatch.output.length"
#: Pass/fail verdict of an evaluation recorded on the agent span (the monitor's oracle).
EVALUATION_PASSED = "assaywatch.evaluation.passed"

# --- environment variables ---------------------------------------------------------------
#: Standard GenAI content-capture opt-in. ``SPAN_ONLY`` or ``SPAN_AND_EVENT`` (any case)
#: put content on spans; unset or ``NO_CONTENT`` (the default) capture none. ``true`` is
#: accepted as ``SPAN_ONLY`` for the older convention. ``EVENT_ONLY`` is honoured by the
#: upstream instrumentations; our own spans then carry no content (we emit no log events).
ENV_CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: ``true`` disables the SDK: ``assaywatch.auto`` then configures and instruments nothing.
ENV_SDK_DISABLED = "OTEL_SDK_DISABLED"
#: Comma list of our framework names (``openai``, ``anthropic``, ``langchain``,
#: ``openai_agents``, or ``*``) not to instrument; the standard variable of
#: ``opentelemetry-instrument``, read with the same names the upstream entry points use.
ENV_DISABLED_INSTRUMENTATIONS = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"
#: Default scenario key for runs that set none (a deployment may serve one scenario).
ENV_SCENARIO = "ASSAYWATCH_SCENARIO"


def content_on_spans(value: str | None) -> bool:
    """Whether the content-capture setting ``value`` puts content on spans.

    Parameters
    ----------
    value:
        The raw value of :data:`ENV_CAPTURE_CONTENT`, or None when unset.
    """
    if value is None:
        return False
    return value.strip().lower() in {"span_only", "span_and_event", "true"}
