"""Reading attribute values of any dialect: typed look-ups, lengths, usage, cost,
evaluations and tool inventories, without ever keeping content.

Used by :func:`assaywatch.monitor.pipeline.normalize.classify` on the hot path: each
function is a bounded number of dict look-ups; text is measured, never stored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from assaywatch.monitor.pipeline.dialects import (
    COST_KEYS,
    MAX_TOOL_DEFINITIONS,
    OI_FIRST_TOOL_KEY,
    OI_TOOLS_PREFIX,
    OI_TOOLS_SUFFIX,
    OUTPUT_CONTENT_KEYS,
    OUTPUT_LENGTH_KEY,
)
from assaywatch.monitor.pipeline.outcome import Evaluation
from assaywatch.monitor.receivers.spans import EVALUATION_OUTCOME_KEYS, AttrValue


def as_str(v: AttrValue) -> str | None:
    if isinstance(v, str):
        return v or None
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return str(v)
    return None


def as_int(v: object) -> int:
    if isinstance(v, bool) or v is None:
        return 0
    if isinstance(v, int):
        return max(v, 0)
    try:
        return max(int(float(v)), 0)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return 0


def as_float(v: object) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    # NaN and the infinities are no value: a cost of inf would make the stream's mean
    # infinite, and JSON (run records, checkpoints) has no spelling for it
    return f if math.isfinite(f) else None


def first_value(attrs: Mapping[str, AttrValue], keys: tuple[str, ...]) -> AttrValue:
    for k in keys:
        v = attrs.get(k)
        if v is not None and v != "":
            return v
    return None


def as_json(v: AttrValue) -> object:
    """A JSON string's value, a structured value as is; a plain string stays a string."""
    if isinstance(v, str) and v[:1] in ("{", "[", '"'):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def text_length(value: object, budget: int = 10_000) -> int:
    """Characters of text in a message structure (iterative; at most ``budget`` nodes).

    GenAI messages ``[{role, parts: [{type: text, content}]}]`` count their ``text`` parts
    only (tool calls, blobs and reasoning are not the answer); ``{content}`` /
    ``{text}`` dicts count that field; other dicts and lists count their string leaves, so
    the same answer has the same length whichever dialect wrapped it.
    """
    total, stack = 0, [value]
    while stack and budget > 0:
        budget -= 1
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            t = v.get("type")
            if "parts" in v:
                stack.append(v["parts"])
            elif t is not None and t != "text":
                continue
            elif "content" in v:
                stack.append(v["content"])
            elif "text" in v:
                stack.append(v["text"])
            else:
                stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
        elif isinstance(v, int | float) and not isinstance(v, bool):
            total += len(str(v))
    return total


def indexed_length(attrs: Mapping[str, AttrValue], prefix: str, suffix: str) -> int | None:
    """Sum of ``<prefix><i><suffix>`` string lengths for i = 0, 1, ... (flattened dialects)."""
    first = attrs.get(f"{prefix}0{suffix}")
    if first is None:
        return None
    total, i, v = 0, 0, first
    while v is not None and i < 1_000:
        total += text_length(v)
        i += 1
        v = attrs.get(f"{prefix}{i}{suffix}")
    return total


_OUTPUT_MESSAGES = ("llm.output_messages.", ".message.content")
_COMPLETIONS = ("gen_ai.completion.", ".content")
#: Every key :func:`output_length_of` reads first (an indexed dialect's index 0): a span
#: carrying none of them has no output length (``classify`` then skips the call).
OUTPUT_LENGTH_SOURCES: frozenset[str] = frozenset({
    OUTPUT_LENGTH_KEY, *OUTPUT_CONTENT_KEYS, "output.value",
    f"{_OUTPUT_MESSAGES[0]}0{_OUTPUT_MESSAGES[1]}", f"{_COMPLETIONS[0]}0{_COMPLETIONS[1]}"})


def output_length_of(attrs: Mapping[str, AttrValue]) -> int | None:
    """Output length in precedence order, or None when neither it nor content was captured.

    Our own instrumentation records ``assaywatch.output.length`` with or without content
    capture; it outranks measuring captured content.
    """
    v = attrs.get(OUTPUT_LENGTH_KEY)
    if v is not None and not isinstance(v, bool) and isinstance(v, int | float | str):
        return as_int(v)
    v = attrs.get("gen_ai.output.messages")
    if v is not None:
        return text_length(as_json(v))
    n = indexed_length(attrs, *_OUTPUT_MESSAGES)
    if n is not None:
        return n
    v = attrs.get("output.value")
    if v is not None:
        mime = attrs.get("output.mime_type")
        return text_length(as_json(v) if mime == "application/json" else v)
    n = indexed_length(attrs, *_COMPLETIONS)
    if n is not None:
        return n
    for key in OUTPUT_CONTENT_KEYS[1:]:
        v = attrs.get(key)
        if v is not None:
            return text_length(as_json(v))
    return None


def usage_detail(attrs: Mapping[str, AttrValue], key: str) -> int:
    """Langfuse ``usage_details`` is a JSON object string: ``{"input": n, "output": m}``."""
    raw = as_json(attrs.get("langfuse.observation.usage_details"))
    if isinstance(raw, dict):
        for k in (key, f"{key}_tokens", "prompt_tokens" if key == "input" else
                  "completion_tokens"):
            if k in raw:
                return as_int(raw[k])
    return 0


_COST_DETAILS = "langfuse.observation.cost_details"
#: Every key :func:`cost_of` reads: a span carrying none of them has no cost.
COST_SOURCES: frozenset[str] = frozenset({*COST_KEYS, _COST_DETAILS})


def cost_of(attrs: Mapping[str, AttrValue]) -> float | None:
    v = first_value(attrs, COST_KEYS)
    if v is not None:
        return as_float(v)
    raw = as_json(attrs.get(_COST_DETAILS))
    if isinstance(raw, dict):
        if "total" in raw:
            return as_float(raw["total"])
        vals = [f for f in (as_float(x) for x in raw.values()) if f is not None]
        total = sum(vals)
        return total if vals and math.isfinite(total) else None
    return None


#: The keys of an evaluation's outcome: :func:`evaluation_of` is None without them.
EVALUATION_SOURCES: frozenset[str] = frozenset(EVALUATION_OUTCOME_KEYS)


def evaluation_of(attrs: Mapping[str, AttrValue]) -> Evaluation | None:
    label = attrs.get("gen_ai.evaluation.score.label")
    score = attrs.get("gen_ai.evaluation.score.value")
    passed = attrs.get("assaywatch.evaluation.passed")
    if label is None and score is None and passed is None:
        return None
    flag: bool | None = None
    if isinstance(passed, bool):
        flag = passed
    elif isinstance(passed, str) and passed.strip().lower() in ("true", "false"):
        flag = passed.strip().lower() == "true"
    return Evaluation(name=as_str(attrs.get("gen_ai.evaluation.name")), label=as_str(label),
                      score=as_float(score), passed=flag)


def _definition_names(v: AttrValue) -> tuple[str, ...]:
    raw = as_json(v)
    if isinstance(raw, dict):
        raw = raw.get("tools", [raw])
    names: list[str] = []
    if isinstance(raw, list | tuple):
        for item in raw[:MAX_TOOL_DEFINITIONS]:
            if isinstance(item, str):
                item = as_json(item)
            if isinstance(item, dict):
                fn = item.get("function")
                name = item.get("name") or (fn.get("name") if isinstance(fn, dict) else None)
                if isinstance(name, str) and name and name not in names:
                    names.append(name)
    return tuple(names)


#: Parsed tool definitions by their JSON text. Agents send the same inventory with every
#: model call, so a span's definitions are usually a dict hit instead of a JSON parse.
#: Bounded in entries and in the length of the texts it keeps.
_DEFINITIONS: dict[str, tuple[str, ...]] = {}
MAX_CACHED_DEFINITIONS, MAX_CACHED_TEXT = 512, 16_384


def tool_definitions_of(v: AttrValue) -> tuple[str, ...]:
    """Tool names of ``gen_ai.tool.definitions`` (a JSON array or object, or structured),
    or of one OpenInference ``llm.tools.<i>.tool.json_schema`` object; never the schemas."""
    if not isinstance(v, str):
        return _definition_names(v)
    names = _DEFINITIONS.get(v)
    if names is None:
        names = _definition_names(v)
        if len(_DEFINITIONS) < MAX_CACHED_DEFINITIONS and len(v) <= MAX_CACHED_TEXT:
            _DEFINITIONS[v] = names
    return names


def openinference_tools_of(attrs: Mapping[str, AttrValue]) -> tuple[str, ...]:
    """Tool names of OpenInference's flattened inventory ``llm.tools.<i>.tool.json_schema``
    (i = 0, 1, ...; at most :data:`MAX_TOOL_DEFINITIONS`); () when the span has none."""
    v = attrs.get(OI_FIRST_TOOL_KEY)
    if v is None:
        return ()
    names: list[str] = []
    i = 0
    while v is not None and i < MAX_TOOL_DEFINITIONS:
        for name in tool_definitions_of(v):
            if name not in names:
                names.append(name)
        i += 1
        v = attrs.get(f"{OI_TOOLS_PREFIX}{i}{OI_TOOLS_SUFFIX}")
    return tuple(names)
