"""A deterministic fake OpenAI-compatible server on loopback, for recording fixtures.

``POST /v1/chat/completions`` (non-streaming only) answers from the request alone, so the
token counts of every recorded run can be written down by a person:

============================================  ==========================  =====  ======
request                                        answer                      input  output
============================================  ==========================  =====  ======
offers ``tools`` and no ``role: tool`` message  one tool call (first tool)  100    20
has a ``role: tool`` message (tool result)      final text                  150    30
anything else (no tools, no tool result)        final text                  50     10
============================================  ==========================  =====  ======

(``prompt_tokens`` / ``completion_tokens`` of ``usage``; ``total_tokens`` is their sum.)
The tool call's arguments are ``{"<first parameter>": "Paris"}``. The response ``model``
echoes the requested model. ``POST .../api/public/otel/v1/traces`` (what the Langfuse SDK
posts to ``{LANGFUSE_HOST}``) is accepted with 200 and its body kept in ``otlp_bodies``.

The server binds 127.0.0.1 on a free port, serves at most ``max_requests`` requests and
shuts itself down after ``idle_timeout`` seconds without a request (bounded either way).

Run standalone (prints the base URL, serves until a bound is reached)::

    python -m tests.conformance.fake_openai
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAI", "TOKENS"]

#: (prompt_tokens, completion_tokens) per answer type.
TOKENS: dict[str, tuple[int, int]] = {
    "tool_call": (100, 20),
    "after_tool": (150, 30),
    "plain": (50, 10),
}
FINAL_AFTER_TOOL = "The weather in Paris is sunny, 21 degrees."
FINAL_PLAIN = "Hello! This is a deterministic answer."
CREATED = 1_700_000_000
MAX_BODY = 4 * 1024 * 1024


def _first_tool(tools: list[Any]) -> tuple[str, str]:
    """Name and first parameter of the first offered function tool."""
    fn = (tools[0] or {}).get("function") or {}
    params = (fn.get("parameters") or {}).get("properties") or {}
    return str(fn.get("name") or "tool"), next(iter(params), "input")


def answer(body: dict[str, Any], seq: int) -> dict[str, Any]:
    """The chat completion for one request body (pure, deterministic)."""
    messages = body.get("messages") or []
    tools = body.get("tools") or []
    has_tool_result = any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
    model = str(body.get("model") or "gpt-4o-mini")
    if tools and not has_tool_result:
        kind = "tool_call"
        name, param = _first_tool(tools)
        message: dict[str, Any] = {
            "role": "assistant", "content": None, "refusal": None,
            "tool_calls": [{"id": f"call_fake_{seq}", "type": "function",
                            "function": {"name": name,
                                         "arguments": json.dumps({param: "Paris"})}}],
        }
        finish = "tool_calls"
    else:
        kind = "after_tool" if has_tool_result else "plain"
        text = FINAL_AFTER_TOOL if has_tool_result else FINAL_PLAIN
        message = {"role": "assistant", "content": text, "refusal": None}
        finish = "stop"
    prompt, completion = TOKENS[kind]
    return {
        "id": f"chatcmpl-fake-{seq}", "object": "chat.completion", "created": CREATED,
        "model": model, "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        pass

    def _send(self, code: int, payload: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(n, MAX_BODY))

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self.server.touch()
        self._send(404, b'{"error":{"message":"not found"}}')

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        seq = self.server.touch()
        raw = self._body()
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.endswith("/api/public/otel/v1/traces"):
            self.server.otlp_bodies.append(raw)
            self._send(200, b"{}")
            return
        if not path.endswith("/chat/completions"):
            self._send(404, b'{"error":{"message":"only /v1/chat/completions"}}')
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, b'{"error":{"message":"invalid JSON"}}')
            return
        if body.get("stream"):
            self._send(400, b'{"error":{"message":"streaming is not supported"}}')
            return
        self.server.requests.append(body)
        self._send(200, json.dumps(answer(body, seq)).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, max_requests: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.max_requests = max_requests
        self.count = 0
        self.last = time.monotonic()
        self.requests: list[dict[str, Any]] = []
        self.otlp_bodies: list[bytes] = []
        self._lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client closing its keep-alive connection is not worth a traceback

    def touch(self) -> int:
        with self._lock:
            self.count += 1
            self.last = time.monotonic()
            if self.count >= self.max_requests:
                threading.Thread(target=self.shutdown, daemon=True).start()
            return self.count


class FakeOpenAI:
    """Context manager: ``with FakeOpenAI() as fake: fake.base_url`` -> ``http://127.0.0.1:P/v1``."""

    def __init__(self, *, max_requests: int = 500, idle_timeout: float = 120.0) -> None:
        self._server = _Server(max_requests)
        self.idle_timeout = idle_timeout
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.root_url = f"http://127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self._server.requests

    @property
    def otlp_bodies(self) -> list[bytes]:
        return self._server.otlp_bodies

    def _watchdog(self) -> None:
        while not self._stop.wait(0.5):
            if time.monotonic() - self._server.last > self.idle_timeout:
                self._server.shutdown()
                return

    def start(self) -> FakeOpenAI:
        for target in (self._server.serve_forever, self._watchdog):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-requests", type=int, default=500)
    ap.add_argument("--idle-timeout", type=float, default=120.0)
    args = ap.parse_args()
    fake = FakeOpenAI(max_requests=args.max_requests, idle_timeout=args.idle_timeout).start()
    print(fake.base_url, flush=True)
    try:
        fake._threads[0].join()
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop()


if __name__ == "__main__":
    main()
