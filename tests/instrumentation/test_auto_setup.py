"""``import assaywatch.auto`` and ``opentelemetry-instrument`` in real subprocesses.

Each test runs a tiny agent script in a fresh interpreter (SDK configuration is global and
one-shot, so it cannot be tested in the pytest process) and asserts on what arrives at a
loopback OTLP sink in the test: an HTTP one decoding ``ExportTraceServiceRequest`` and a
gRPC one. Nothing binds or contacts the default ports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from assaywatch.instrumentation import setup

FakeLLMServer = Any


@dataclass
class Sink:
    """What a loopback OTLP receiver got: request headers and decoded spans."""

    endpoint: str
    headers: list[dict[str, str]] = field(default_factory=list)
    requests: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)

    def spans(self) -> list[Any]:
        return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans
                for s in ss.spans]

    def resource(self) -> dict[str, str]:
        rs = self.requests[0].resource_spans[0]
        return {kv.key: kv.value.string_value for kv in rs.resource.attributes}


@pytest.fixture
def http_sink() -> Iterator[Sink]:
    sink = Sink(endpoint="")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return None

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            req = trace_service_pb2.ExportTraceServiceRequest()
            req.ParseFromString(body)
            sink.headers.append({k.lower(): v for k, v in self.headers.items()} |
                                {":path": self.path})
            sink.requests.append(req)
            out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sink.endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield sink
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def grpc_sink() -> Iterator[Sink]:
    grpc = pytest.importorskip("grpc")
    sink = Sink(endpoint="")

    class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
            sink.headers.append(dict(context.invocation_metadata()))
            sink.requests.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sink.endpoint = f"http://127.0.0.1:{port}"
    yield sink
    server.stop(0)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "ASSAYWATCH_"))}
    env.update(OPENAI_API_KEY="sk-test", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _run(tmp_path: Path, code: str, env: dict[str, str],
         argv: list[str] | None = None) -> dict[str, Any]:
    """Run ``code`` as a script; it prints one JSON line last, which is returned."""
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(code))
    cmd = (argv or [sys.executable]) + [str(script)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


NO_FRAMEWORKS = {"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "*"}  # faster where not under test


def test_plain_import_has_no_side_effects(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        import json, sys
        import assaywatch, assaywatch.instrumentation
        from opentelemetry import trace
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "openai")
                       or m.startswith(("assaywatch.monitor", "assaywatch.analyzers")))
        print(json.dumps({"heavy": heavy, "version": assaywatch.__version__,
                          "proxy": type(trace.get_tracer_provider()).__name__,
                          "instrumented": assaywatch.instrumentation.is_instrumented()}))
    """, _env())
    assert out == {"heavy": [], "version": out["version"], "proxy": "ProxyTracerProvider",
                   "instrumented": False}


def test_auto_keeps_app_provider_and_double_import_is_noop(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        import importlib, json
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        app_exporter = InMemorySpanExporter()
        app_provider = TracerProvider()
        app_provider.add_span_processor(SimpleSpanProcessor(app_exporter))
        trace.set_tracer_provider(app_provider)

        import assaywatch.auto
        n_processors = len(app_provider._active_span_processor._span_processors)
        importlib.reload(assaywatch.auto)  # a second execution of the one import
        from openai.resources.chat.completions import Completions
        from assaywatch.instrumentation import agent_run
        with agent_run("app-bot"):
            pass
        print(json.dumps({
            "same_provider": trace.get_tracer_provider() is app_provider,
            "processors": [n_processors,
                           len(app_provider._active_span_processor._span_processors)],
            "wrap_depth": sum(1 for f in [Completions.create, Completions.create.__wrapped__]
                              if type(f).__name__ == "BoundFunctionWrapper"
                              or type(f).__name__ == "FunctionWrapper"),
            "app_spans": [s.name for s in app_exporter.get_finished_spans()]}))
    """, _env(OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="anthropic,langchain,openai_agents"))
    assert out["same_provider"] is True
    assert out["processors"] == [2, 2]  # app's + our scenario processor, not re-added
    assert out["wrap_depth"] == 1
    assert out["app_spans"] == ["invoke_agent app-bot"]


def test_auto_exports_otlp_http_per_env(tmp_path: Path, http_sink: Sink) -> None:
    env = _env(OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
               OTEL_EXPORTER_OTLP_ENDPOINT=http_sink.endpoint,
               OTEL_EXPORTER_OTLP_HEADERS="x-api-key=abc123",
               OTEL_SERVICE_NAME="svc-from-env",
               OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test,service.version=1.2",
               **NO_FRAMEWORKS)
    _run(tmp_path, """
        import assaywatch.auto
        from assaywatch.instrumentation import agent_run, tool
        @tool
        def fetch(x):
            return x * 3
        with agent_run("env-bot", scenario="s1") as run:
            run.set_output(fetch("ab"))
    """, env)  # spans are flushed by the SDK's atexit shutdown
    assert http_sink.headers[0][":path"] == "/v1/traces"
    assert http_sink.headers[0]["x-api-key"] == "abc123"
    res = http_sink.resource()
    assert res["service.name"] == "svc-from-env"
    assert res["deployment.environment"] == "test" and res["service.version"] == "1.2"
    spans = {s.name: s for s in http_sink.spans()}
    assert set(spans) == {"invoke_agent env-bot", "execute_tool fetch"}
    assert spans["execute_tool fetch"].parent_span_id == spans["invoke_agent env-bot"].span_id


def test_auto_default_protocol_is_grpc(tmp_path: Path, grpc_sink: Sink) -> None:
    env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=grpc_sink.endpoint,
               OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer t", **NO_FRAMEWORKS)
    _run(tmp_path, """
        import assaywatch.auto
        from assaywatch.instrumentation import agent_run
        with agent_run("grpc-bot"):
            pass
    """, env)
    assert [s.name for s in grpc_sink.spans()] == ["invoke_agent grpc-bot"]
    assert grpc_sink.headers[0]["authorization"] == "Bearer t"


def test_sdk_disabled_configures_and_instruments_nothing(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        import json
        import assaywatch.auto
        from opentelemetry import trace
        from openai.resources.chat.completions import Completions
        from assaywatch.instrumentation import is_instrumented
        print(json.dumps({"provider": type(trace.get_tracer_provider()).__name__,
                          "instrumented": is_instrumented(),
                          "patched": hasattr(Completions.create, "__wrapped__")
                                     and type(Completions.create).__name__.endswith("Wrapper")}))
    """, _env(OTEL_SDK_DISABLED="true"))
    assert out == {"provider": "ProxyTracerProvider", "instrumented": False, "patched": False}


def test_opentelemetry_instrument_loads_our_entry_point(tmp_path: Path, http_sink: Sink,
                                                        fake_llm: FakeLLMServer) -> None:
    launcher = shutil.which("opentelemetry-instrument",
                            path=str(Path(sys.executable).parent))
    if launcher is None:
        pytest.skip("opentelemetry-instrument is not installed")
    env = _env(OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
               OTEL_EXPORTER_OTLP_ENDPOINT=http_sink.endpoint,
               OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="anthropic,langchain,openai_agents",
               OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none",
               OTEL_LOGS_EXPORTER="none", FAKE_LLM=fake_llm.base_url)
    _run(tmp_path, """
        import os, openai
        from assaywatch.instrumentation import agent_run  # no assaywatch.auto import
        client = openai.OpenAI(base_url=os.environ["FAKE_LLM"] + "/v1", max_retries=0)
        with agent_run("cli-bot"):
            client.chat.completions.create(model="gpt-cli",
                                           messages=[{"role": "user", "content": "hi"}])
    """, env, argv=[launcher, sys.executable])
    spans = {s.name: s for s in http_sink.spans()}
    assert set(spans) == {"invoke_agent cli-bot", "chat gpt-cli"}
    assert spans["chat gpt-cli"].parent_span_id == spans["invoke_agent cli-bot"].span_id


def test_exporter_defaults_point_at_the_local_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    # Construction only: nothing is sent, so the default ports are never contacted.
    for var in [v for v in os.environ if v.startswith("OTEL_EXPORTER_OTLP")]:
        monkeypatch.delenv(var)
    grpc_exp = setup.make_exporter()
    http_exp = setup.make_exporter(protocol="http/protobuf")
    assert type(grpc_exp).__module__.endswith("grpc.trace_exporter")
    assert grpc_exp._endpoint == "localhost:4317"
    assert http_exp._endpoint == "http://localhost:4318/v1/traces"
    custom = setup.make_exporter(protocol="http/protobuf", endpoint="http://127.0.0.1:9/")
    assert custom._endpoint == "http://127.0.0.1:9/v1/traces"
    for exp in (grpc_exp, http_exp, custom):
        exp.shutdown()


def test_protocol_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    assert setup.resolve_protocol() == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "HTTP/Protobuf")
    assert setup.resolve_protocol() == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")  # signal-specific wins
    assert setup.resolve_protocol() == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "carrier-pigeon")
    assert setup.resolve_protocol() == "grpc"  # bad env value: logged, default
    assert setup.resolve_protocol("http/protobuf") == "http/protobuf"  # argument wins
    with pytest.raises(ValueError, match="protocol must be one of"):
        setup.resolve_protocol("udp")
