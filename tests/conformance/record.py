"""Re-record the conformance fixtures from the real instrumentation packages.

    python -m tests.conformance.record [NAME ...] [--out DIR] [--runs N] [--latest]
                                        [--python NAME=INTERPRETER ...] [--no-envs]
                                        [--otlp-endpoint URL]

For each scenario (all by default; names in ``agents.SCENARIOS``) this starts the fake
OpenAI server (``fake_openai``) on 127.0.0.1, runs the scenario's agent ``--runs`` times in
a subprocess (``python -m tests.conformance.agents NAME``) with the real instrumentation
and the real OpenTelemetry SDK, and writes ``DIR/NAME.jsonl`` (one OTLP/JSON
``ExportTraceServiceRequest`` per agent invocation). Run it from the repository root with
the interpreter of the scenario's environment built by ``setup_envs.sh`` (``envs.py``:
``env-a``/``env-b``, or ``env-latest``/``env-latest-v2`` with ``--latest``) when it exists,
else the interpreter running this script (always with ``--no-envs``); ``--python
NAME=PATH`` runs one scenario with another interpreter. A scenario whose packages cannot be
imported is skipped with its reason. ``--otlp-endpoint URL`` also sends the spans live
over OTLP/HTTP to a collector or ``assaywatch monitor`` (``agents.py``).

When ``DIR/NAME.expected.json`` exists its ``recorded_with`` field (package versions of the
interpreter that recorded) is refreshed; the expectations themselves are written by a
person and never touched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conformance import envs
from tests.conformance.agents import EXIT_SKIP, SCENARIOS
from tests.conformance.fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TIMEOUT_S = 180

#: Distributions whose versions are recorded per scenario.
PACKAGES: dict[str, tuple[str, ...]] = {
    "openinference_openai_agent": ("openai", "openinference-instrumentation-openai",
                                   "openinference-instrumentation",
                                   "openinference-semantic-conventions"),
    "openinference_openai_bare": ("openai", "openinference-instrumentation-openai",
                                  "openinference-instrumentation",
                                  "openinference-semantic-conventions"),
    "openinference_langgraph_default": ("langgraph", "langchain-core", "langchain-openai",
                                        "openai", "openinference-instrumentation-langchain",
                                        "openinference-instrumentation",
                                        "openinference-semantic-conventions"),
    "openinference_langgraph_named": ("langgraph", "langchain-core", "langchain-openai",
                                      "openai", "openinference-instrumentation-langchain",
                                      "openinference-instrumentation",
                                      "openinference-semantic-conventions"),
    "traceloop_sdk": ("traceloop-sdk", "opentelemetry-instrumentation-openai",
                      "opentelemetry-semantic-conventions-ai", "openai"),
    "otel_openai_v2_with_agent": ("opentelemetry-instrumentation-openai-v2",
                                  "opentelemetry-util-genai", "openai"),
    "otel_openai_v2_bare": ("opentelemetry-instrumentation-openai-v2",
                            "opentelemetry-util-genai", "openai"),
    "langfuse_sdk": ("langfuse", "openai"),
    "openai_agents_sdk": ("openai-agents", "opentelemetry-instrumentation-genai-openai-agents",
                          "opentelemetry-instrumentation-genai-openai",
                          "opentelemetry-util-genai", "openai"),
}
COMMON = ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-common",
          "opentelemetry-proto", "protobuf")


def versions(python: str, names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``names`` in the interpreter ``python`` (missing ones omitted)."""
    code = ("import json, sys, importlib.metadata as m\n"
            "out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    res = subprocess.run([python, "-c", code, *names], capture_output=True, text=True,
                         timeout=60)
    return dict(json.loads(res.stdout)) if res.returncode == 0 else {}


def _refresh_expected(path: Path, recorded_with: dict[str, object]) -> None:
    if not path.exists():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    data["recorded_with"] = recorded_with
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def agent_env() -> dict[str, str]:
    """The environment of an agent subprocess: no inherited OTEL_/TRACELOOP_/LANGFUSE_
    settings, no telemetry of the packages themselves, loopback without a proxy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACELOOP_",
                                                                      "LANGFUSE_"))}
    env.update({"OPENAI_API_KEY": "sk-fake", "TRACELOOP_TELEMETRY": "false",
                "PYTHONPATH": str(ROOT), "OTEL_SDK_DISABLED": "false",
                "OPENAI_AGENTS_DISABLE_TRACING": "0", "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost"})
    return env


def record(name: str, out_dir: Path, runs: int, python: str,
           otlp_endpoint: str | None = None) -> tuple[str, str]:
    """Record one scenario; returns (status, detail) with status recorded/skipped/failed.

    With ``otlp_endpoint`` the agent also exports its spans live over OTLP/HTTP there.
    """
    out = out_dir / f"{name}.jsonl"
    tmp = out_dir / f".{name}.jsonl.tmp"
    tmp.unlink(missing_ok=True)
    env = agent_env()
    live = ["--otlp-endpoint", otlp_endpoint] if otlp_endpoint else []
    with FakeOpenAI(max_requests=20 * runs + 50, idle_timeout=TIMEOUT_S) as fake:
        env["OPENAI_BASE_URL"] = fake.base_url
        t0 = time.monotonic()
        try:
            res = subprocess.run(
                [python, "-m", "tests.conformance.agents", name, "--base-url", fake.base_url,
                 "--out", str(tmp), "--runs", str(runs), *live],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            tmp.unlink(missing_ok=True)
            return "failed", f"timed out after {TIMEOUT_S} s"
        n_requests = len(fake.requests)
    if res.returncode == EXIT_SKIP:
        tmp.unlink(missing_ok=True)
        skip = [ln for ln in res.stderr.splitlines() if ln.startswith("SKIP:")]
        return "skipped", (skip[-1] if skip else res.stderr.strip()[-500:])
    if res.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        return "failed", (res.stderr.strip()[-2000:] or f"exit {res.returncode}")
    tmp.replace(out)
    if (out_dir / f"{name}.expected.json").exists():
        recorded_with = {"python": python_version(python),
                         "packages": versions(python, PACKAGES.get(name, ()) + COMMON)}
        _refresh_expected(out_dir / f"{name}.expected.json", recorded_with)
    lines = sum(1 for ln in out.read_text(encoding="utf-8").splitlines() if ln.strip())
    return "recorded", (f"{out} ({out.stat().st_size} bytes, {lines} lines, "
                        f"{n_requests} model requests, {time.monotonic() - t0:.1f} s)")


def python_version(python: str) -> str:
    res = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                         capture_output=True, text=True, timeout=60)
    return res.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"scenarios (default all): "
                    f"{', '.join(SCENARIOS)}")
    ap.add_argument("--out", default=str(FIXTURES), help="output folder (default: fixtures/)")
    ap.add_argument("--runs", type=int, default=3, help="agent invocations per scenario")
    ap.add_argument("--python", action="append", default=[], metavar="NAME=INTERPRETER",
                    help="run scenario NAME with another Python (repeatable)")
    ap.add_argument("--latest", action="store_true",
                    help="use the newest-release environments (env-latest, env-latest-v2) "
                         "instead of the pinned ones (env-a, env-b)")
    ap.add_argument("--no-envs", action="store_true",
                    help="ignore the setup_envs.sh environments: every scenario without "
                         "--python runs with this interpreter")
    ap.add_argument("--otlp-endpoint", metavar="URL",
                    help="also send the spans live over OTLP/HTTP to URL")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; choose from {sorted(SCENARIOS)}")
    interpreters: dict[str, str] = {}
    for item in args.python:
        name, sep, path = item.partition("=")
        if not sep or name not in SCENARIOS:
            ap.error(f"--python wants NAME=INTERPRETER with a known NAME, got {item!r}")
        interpreters[name] = path
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.names or list(SCENARIOS):
        python = interpreters.get(name)
        if python is None and not args.no_envs:
            found = envs.interpreter(name, latest=args.latest)
            python = str(found) if found else None
        status, detail = record(name, out_dir, args.runs, python or sys.executable,
                                args.otlp_endpoint)
        print(f"{status:9s} {name}: {detail}", flush=True)
        failed += status == "failed"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
