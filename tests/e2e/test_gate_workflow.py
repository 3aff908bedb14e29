"""README's pre-deploy gate recipe, run verbatim.

The ``sh`` blocks of README section "### 3. A pre-deploy gate in CI" are extracted and run
with ``bash -eo pipefail`` (as a CI step runs them) in a temporary directory, unchanged:

* ``python my_agent_evals.py`` finds a small agent written there by this test,
  instrumented with ``import assaywatch.auto`` and the manual API exactly as README's
  section 1 shows, and ``python`` / ``assaywatch`` are this interpreter's (on ``PATH``);
* the recorder's ports come from the variables README names for that
  (``ASSAYWATCH_OTLP_GRPC``/``_HTTP`` and ``OTEL_EXPORTER_OTLP_ENDPOINT``), set to free
  loopback ports: nothing binds or contacts the defaults;
* what differs between the known-good version and a candidate is the agent's behaviour,
  set through its environment (as a checkout of another version would change its code);
* the agent's tool takes 5-25 ms, as a real service call would: without any latency a run
  lasts ~0.1 ms and its duration measures the recording route (OTLP to the recorder for
  the known-good version, a gzip file for the candidate) and the machine's load, which
  once made the fingerprint test answer "manual review" for an unchanged candidate.

The first block records the known-good version with ``assaywatch record`` and builds the
baseline; the second records a candidate through ``ASSAYWATCH_SPANS_FILE`` and gates it.
An unchanged candidate must deploy (exit 0), a regressed one be blocked (exit 1), both
leaving JUnit, Markdown and HTML reports that name the stream.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### 3. A pre-deploy gate in CI"
AGENT_COMMAND = "python my_agent_evals.py"
RUNS = 100

AGENT = textwrap.dedent(f"""
    import assaywatch.auto  # first line: tracing on

    import os
    import random
    import time

    from assaywatch.instrumentation import agent_run, record_evaluation, tool

    rng = random.Random(int(os.environ["SIM_SEED"]))
    pass_rate = float(os.environ["SIM_PASS_RATE"])


    @tool("lookup_order")
    def lookup_order(order_id: str) -> str:
        time.sleep(rng.uniform(0.005, 0.025))  # the order service's latency
        return "shipped " * rng.randint(1, 4)


    for i in range({RUNS}):
        with agent_run("support-agent", version=os.environ["SIM_VERSION"],
                       scenario="refund") as run:
            for _ in range(rng.randint(1, 3)):
                lookup_order(str(i))
            run.set_output("your refund is on its way " * rng.randint(1, 3))
            record_evaluation(passed=rng.random() < pass_rate)
""")


def readme_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.index("\n## ", start)
    return re.findall(r"```sh\n(.*?)```", text[start:end], re.S)


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [int(s.getsockname()[1]) for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python`` and ``assaywatch`` of this interpreter, for the README's lines."""
    d = tmp_path_factory.mktemp("bin")
    # Scripts, not symlinks: a venv's interpreter linked from elsewhere loses the venv.
    for name, args in (("python", ""), ("assaywatch", " -m assaywatch.monitor.commands.cli")):
        (d / name).write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        (d / name).chmod(0o755)
    return d


def run_block(block: str, cwd: Path, bin_dir: Path, **agent_env: str
              ) -> subprocess.CompletedProcess[str]:
    assert AGENT_COMMAND in block, "the README block no longer runs the agent command"
    grpc, http = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ASSAYWATCH_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               ASSAYWATCH_OTLP_GRPC=f"127.0.0.1:{grpc}",
               ASSAYWATCH_OTLP_HTTP=f"127.0.0.1:{http}",
               OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{grpc}",
               # no agent framework is used; importing them only slows the agent's start
               OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="*",
               **agent_env)
    # Its own session, output to files: if a line fails, bash -e exits and leaves the
    # recorder running; it is killed with the session and cannot hold a pipe open.
    out, err = cwd / "block.stdout", cwd / "block.stderr"
    with out.open("w") as fo, err.open("w") as fe:
        proc = subprocess.Popen(["bash", "-eo", "pipefail", "-c", block], cwd=cwd, env=env,
                                stdout=fo, stderr=fe, start_new_session=True)
        try:
            code = proc.wait(timeout=600)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return subprocess.CompletedProcess(proc.args, code, out.read_text(), err.read_text())


@pytest.fixture(scope="module")
def known_good(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Path:
    """README's first block: the known-good version recorded by `assaywatch record`,
    then its baseline."""
    blocks = readme_blocks()
    assert len(blocks) == 2, "README's gate section should have two sh blocks"
    work = tmp_path_factory.mktemp("known-good")
    (work / "my_agent_evals.py").write_text(AGENT)
    res = run_block(blocks[0], work, bin_dir, SIM_SEED="1", SIM_PASS_RATE="1.0",
                    SIM_VERSION="1.4.0")
    assert res.returncode == 0, res.stdout + res.stderr
    log = (work / "record.log").read_text()
    m = re.search(r"wrote (\d+) spans \((\d+) traces\) to spans/known-good\.jsonl\.gz", log)
    assert m is not None, log
    assert int(m.group(2)) == RUNS  # every run reached the file through OTLP
    assert (work / "baselines" / "support-agent.json").is_file()
    return work


@pytest.mark.parametrize("case,seed,pass_rate,exit_code", [
    ("unchanged", "2", "1.0", 0),
    ("regressed", "3", "0.5", 1),
])
def test_readme_gate_recipe(known_good: Path, bin_dir: Path, tmp_path: Path, case: str,
                            seed: str, pass_rate: str, exit_code: int) -> None:
    work = tmp_path / case
    shutil.copytree(known_good, work)
    (work / "spans" / "known-good.jsonl.gz").unlink()  # the candidate needs only the baseline
    res = run_block(readme_blocks()[1], work, bin_dir, SIM_SEED=seed, SIM_PASS_RATE=pass_rate,
                    SIM_VERSION="1.5.0")
    assert res.returncode == exit_code, res.stdout + res.stderr
    assert (work / "spans" / "candidate.jsonl.gz").is_file()  # written by the agent itself
    for name in ("assaywatch-junit.xml", "assaywatch-summary.md", "assaywatch-report.html"):
        text = (work / name).read_text(encoding="utf-8")
        assert "support-agent" in text and "refund" in text, name
    junit = (work / "assaywatch-junit.xml").read_text(encoding="utf-8")
    assert ("<failure" in junit) == (exit_code == 1)


COLLECTOR = ROOT / "deploy" / "collector" / "bin" / "assaywatch-otelcol"
COLLECTOR_CONFIG = ROOT / "deploy" / "record" / "collector-fileexporter.yaml"


@pytest.mark.skipif(not COLLECTOR.is_file(), reason="no Collector build at "
                    "deploy/collector/bin/assaywatch-otelcol (deploy/collector/build.sh)")
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_collector_fileexporter_config_records_what_the_gate_reads(
        known_good: Path, bin_dir: Path, tmp_path: Path, protocol: str) -> None:
    """deploy/record's Collector config: the agent's spans through a real Collector into
    a file, gated against README's baseline (regressed candidate: blocked)."""
    res = subprocess.run([str(COLLECTOR), "validate", "--config", str(COLLECTOR_CONFIG)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    (tmp_path / "spans").mkdir()
    grpc, http = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ASSAYWATCH_"))}
    env.update(RECORD_OTLP_GRPC=f"127.0.0.1:{grpc}", RECORD_OTLP_HTTP=f"127.0.0.1:{http}")
    log = (tmp_path / "collector.log").open("w")
    collector = subprocess.Popen([str(COLLECTOR), "--config", str(COLLECTOR_CONFIG)],
                                 cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert collector.poll() is None, (tmp_path / "collector.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", grpc), timeout=1).close()
                socket.create_connection(("127.0.0.1", http), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the Collector did not start listening"
                time.sleep(0.2)
        (tmp_path / "my_agent_evals.py").write_text(AGENT)
        port = grpc if protocol == "grpc" else http
        agent = subprocess.run(
            [sys.executable, "my_agent_evals.py"], cwd=tmp_path, capture_output=True,
            text=True, timeout=300,
            env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                 "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                 "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "*",
                 "SIM_SEED": "4", "SIM_PASS_RATE": "0.5", "SIM_VERSION": "1.5.0"})
        assert agent.returncode == 0, agent.stderr
    finally:
        collector.send_signal(signal.SIGTERM)  # drains the batch, flushes the file
        code = collector.wait(60)
        log.close()
    assert code == 0, (tmp_path / "collector.log").read_text()
    files = sorted(str(p) for p in (tmp_path / "spans").glob("recorded*.jsonl"))
    assert files
    gate = subprocess.run(
        [str(bin_dir / "assaywatch"), "gate", "--baseline",
         str(known_good / "baselines" / "support-agent.json"), "--candidate", *files,
         "--junit", str(tmp_path / "junit.xml"), "--strict"],
        capture_output=True, text=True, timeout=300)
    assert gate.returncode == 1, gate.stdout + gate.stderr
    assert "support-agent" in (tmp_path / "junit.xml").read_text()
