"""Fixtures for the instrumentation tests: a loopback fake LLM server and span capture.

The fake server speaks just enough of three wire formats for the real SDK clients to
work against it (chat completions, responses, Anthropic messages; each plain JSON and
SSE streaming, with tool calls). It is scripted by the request itself, which keeps the
tests deterministic:

- a request that offers tools and does not end with a tool result gets a tool call, with
  arguments ``{"city": "Paris"}``, to the first ``transfer_to_*`` tool offered (an
  OpenAI Agents handoff), else to the first tool;
- any other request gets the final text :data:`FINAL_TEXT`;
- the model name ``"error-model"`` gets an HTTP 400 error (400 so the SDKs do not retry).

Token usage is derived from the request (``input = 10 + number of messages``,
``output = 5`` for a tool call and ``len(FINAL_TEXT.split())`` for text) and every
reply's usage is logged in :attr:`FakeLLMServer.replies` so tests compare span
attributes against what was actually sent on the wire.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

FINAL_TEXT = "The weather in Paris is sunny today"
TOOL_ARGS = {"city": "Paris"}
ERROR_MODEL = "error-model"


@dataclass
class Reply:
    """One reply sent by the fake server: which API, and the usage it reported."""

    api: str
    stream: bool
    model: str
    input_tokens: int
    output_tokens: int
    tool_call: str | None


@dataclass
class FakeLLMServer:
    """Handle on the running server: its base URL and the replies it sent."""

    base_url: str
    replies: list[Reply] = field(default_factory=list)
    FINAL_TEXT = FINAL_TEXT
    TOOL_ARGS = TOOL_ARGS
    ERROR_MODEL = ERROR_MODEL
    requests: list[dict[str, Any]] = field(default_factory=list)


def _has_tool_result(api: str, body: dict[str, Any]) -> bool:
    """Whether the conversation ends with a tool result (an agent handoff's does not count:
    the receiving agent starts afresh)."""
    if api == "chat":
        msgs = body.get("messages", [])
        return bool(msgs) and msgs[-1].get("role") == "tool"
    if api == "responses":
        items = body.get("input")
        if not isinstance(items, list) or not items:
            return False
        last = items[-1]
        if not isinstance(last, dict) or last.get("type") != "function_call_output":
            return False
        calls = {i.get("call_id"): i.get("name") for i in items
                 if isinstance(i, dict) and i.get("type") == "function_call"}
        return not str(calls.get(last.get("call_id"), "")).startswith("transfer_to_")
    msgs = body.get("messages", [])
    content = msgs[-1].get("content") if msgs else None
    return isinstance(content, list) and any(
        isinstance(c, dict) and c.get("type") == "tool_result" for c in content)


def _first_tool(api: str, body: dict[str, Any]) -> str | None:
    tools = body.get("tools") or []
    if not tools:
        return None
    handoffs = [t for t in tools if str(t.get("name", "")).startswith("transfer_to_")]
    t = handoffs[0] if handoffs else tools[0]
    if api == "chat":
        return str(t["function"]["name"])
    return str(t["name"])


def _n_messages(api: str, body: dict[str, Any]) -> int:
    if api == "responses":
        items = body.get("input")
        return len(items) if isinstance(items, list) else 1
    return len(body.get("messages", []))


def _pieces() -> list[str]:
    """FINAL_TEXT cut into streaming deltas that concatenate back to it exactly."""
    words = FINAL_TEXT.split(" ")
    return [words[0]] + [" " + w for w in words[1:]]


def _sse(event: str | None, data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _chat(model: str, tool: str | None, usage: tuple[int, int], stream: bool,
          call_id: str) -> list[bytes]:
    n_in, n_out = usage
    usage_d = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
    tool_calls = [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps(TOOL_ARGS)},
        }
    ] if tool else None
    finish = "tool_calls" if tool else "stop"
    if not stream:
        message: dict[str, Any] = {"role": "assistant", "content": None if tool else FINAL_TEXT}
        if tool_calls:
            message["tool_calls"] = tool_calls
        body = {
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage_d,
        }
        return [json.dumps(body).encode()]
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    chunks: list[bytes] = []
    if tool_calls:
        delta: dict[str, Any] = {"role": "assistant", "tool_calls": [{"index": 0, **tool_calls[0]}]}
        chunks.append(_sse(None, {**base, "choices": [{"index": 0, "delta": delta}]}))
    else:
        for i, word in enumerate(FINAL_TEXT.split(" ")):
            piece = word if i == 0 else " " + word
            d = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            chunks.append(_sse(None, {**base, "choices": [{"index": 0, "delta": d}]}))
    chunks.append(_sse(None, {**base, "choices": [
        {"index": 0, "delta": {}, "finish_reason": finish}]}))
    chunks.append(_sse(None, {**base, "choices": [], "usage": usage_d}))
    chunks.append(_sse(None, "[DONE]"))
    return chunks


def _responses(model: str, tool: str | None, usage: tuple[int, int], stream: bool,
               call_id: str) -> list[bytes]:
    n_in, n_out = usage
    if tool:
        item: dict[str, Any] = {
            "type": "function_call", "id": "fc_" + call_id, "call_id": call_id, "name": tool,
            "arguments": json.dumps(TOOL_ARGS), "status": "completed",
        }
    else:
        item = {
            "type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": FINAL_TEXT, "annotations": []}],
        }
    resp = {
        "id": "resp_1", "object": "response", "created_at": 1, "model": model,
        "status": "completed", "output": [item], "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
        "usage": {
            "input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
    if not stream:
        return [json.dumps(resp).encode()]
    started = {**resp, "status": "in_progress", "output": [], "usage": None}
    out = [_sse("response.created", {"type": "response.created", "sequence_number": 0,
                                      "response": started})]
    seq = 1
    if not tool:
        for piece in _pieces():
            out.append(_sse("response.output_text.delta", {
                "type": "response.output_text.delta", "sequence_number": seq, "item_id": "msg_1",
                "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []}))
            seq += 1
    out.append(_sse("response.output_item.done", {
        "type": "response.output_item.done", "sequence_number": seq, "output_index": 0,
        "item": item}))
    out.append(_sse("response.completed", {"type": "response.completed",
                                           "sequence_number": seq + 1, "response": resp}))
    return out


def _anthropic(model: str, tool: str | None, usage: tuple[int, int], stream: bool,
               call_id: str) -> list[bytes]:
    n_in, n_out = usage
    block: dict[str, Any] = (
        {"type": "tool_use", "id": "toolu_" + call_id, "name": tool, "input": TOOL_ARGS}
        if tool else {"type": "text", "text": FINAL_TEXT}
    )
    stop = "tool_use" if tool else "end_turn"
    msg = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": model,
        "content": [block], "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": n_in, "output_tokens": n_out},
    }
    if not stream:
        return [json.dumps(msg).encode()]
    start = {**msg, "content": [], "stop_reason": None,
             "usage": {"input_tokens": n_in, "output_tokens": 1}}
    out = [_sse("message_start", {"type": "message_start", "message": start})]
    if tool:
        out.append(_sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {**block, "input": {}}}))
        out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "input_json_delta",
                                                          "partial_json": json.dumps(TOOL_ARGS)}}))
    else:
        out.append(_sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}}))
        for piece in _pieces():
            out.append(_sse("content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": piece}}))
    out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    out.append(_sse("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": n_out}}))
    out.append(_sse("message_stop", {"type": "message_stop"}))
    return out


_ROUTES = {"/chat/completions": "chat", "/responses": "responses", "/messages": "anthropic"}


def _make_handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return None

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            api = next((a for suffix, a in _ROUTES.items() if path.endswith(suffix)), None)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            server.requests.append({"path": path, "body": body})
            if api is None:
                self._send(404, [b'{"error": {"message": "unknown path"}}'], "application/json")
                return
            model = str(body.get("model", ""))
            if model == ERROR_MODEL:
                err = {"type": "error", "error": {"type": "invalid_request_error",
                                                  "message": "model not found", "code": "bad"}}
                self._send(400, [json.dumps(err).encode()], "application/json")
                return
            tool = None if _has_tool_result(api, body) else _first_tool(api, body)
            n_in = 10 + _n_messages(api, body)
            n_out = 5 if tool else len(FINAL_TEXT.split())
            stream = bool(body.get("stream"))
            server.replies.append(Reply(api, stream, model, n_in, n_out, tool))
            build = {"chat": _chat, "responses": _responses, "anthropic": _anthropic}[api]
            chunks = build(model, tool, (n_in, n_out), stream, f"call_{len(server.replies)}")
            ctype = "text/event-stream" if stream else "application/json"
            self._send(200, chunks, ctype)

        def _send(self, status: int, chunks: list[bytes], ctype: str) -> None:
            data = b"".join(chunks)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("request-id", "req_1")
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture(scope="session")
def fake_llm() -> Iterator[FakeLLMServer]:
    """A fake LLM server on 127.0.0.1 and a free port, for the whole session."""
    handle = FakeLLMServer(base_url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(handle))
    handle.base_url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield handle
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def llm(fake_llm: FakeLLMServer) -> FakeLLMServer:
    """The session's fake server with its logs cleared for this test."""
    fake_llm.replies.clear()
    fake_llm.requests.clear()
    return fake_llm


@dataclass
class Capture:
    """A TracerProvider wired to an in-memory exporter."""

    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]


@pytest.fixture
def capture(monkeypatch: pytest.MonkeyPatch) -> Iterator[Capture]:
    """Instrument everything into an in-memory exporter; uninstrument afterwards.

    Content capture is explicitly off (the variable is removed) unless a test sets it
    before calling :func:`instrumented`.
    """
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Capture(provider, exporter)
    from assaywatch.instrumentation import uninstrument

    uninstrument()
