"""The pytest plugin and ``@assaywatch.stochastic``, run in a child pytest session."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = textwrap.dedent('''
    import random

    import assaywatch

    RNG = random.Random(4)

    @assaywatch.stochastic(threshold=0.9, delta=0.1, max_runs=100)
    def test_half():
        assert RNG.random() < 0.5, "coin came up tails"

    @assaywatch.stochastic(threshold=0.9, delta=0.1, max_runs=200)
    def test_reliable():
        assert RNG.random() < 0.99

    @assaywatch.stochastic(threshold=0.9, delta=0.1, max_runs=5)
    def test_small_budget():
        assert RNG.random() < 0.9

    @assaywatch.stochastic(threshold=0.9, delta=0.1, max_runs=5, inconclusive="xfail")
    def test_small_budget_xfail():
        assert RNG.random() < 0.9

    CALLS = []

    @assaywatch.stochastic(max_runs=50)
    def test_error_is_reported():
        CALLS.append(1)
        raise KeyError("agent config missing")

    def test_plain():
        assert True
''')


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_stoch.py").write_text(TESTS)
    # the plugin is loaded through its pytest11 entry point, as in a user's project
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-rA", "test_stoch.py", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def test_verdicts_in_the_summary(tmp_path: Path) -> None:
    spans = tmp_path / "trials.jsonl"
    r = _pytest(tmp_path, f"--assaywatch-spans={spans}")
    out = r.stdout
    assert "FAILED test_stoch.py::test_half" in out and "coin came up tails" in out
    assert "PASSED test_stoch.py::test_reliable" in out
    assert "SKIPPED" in out and "test_small_budget" in out
    assert "XFAIL test_stoch.py::test_small_budget_xfail" in out
    # A non-assertion exception is an error of the test, raised on the first trial.
    assert "test_error_is_reported" in out and "KeyError: 'agent config missing'" in out
    assert "assaywatch stochastic tests" in out and "95% Wilson" in out
    assert "PASSED test_stoch.py::test_plain" in out
    # The trials' spans are a span file the offline gate reads: one run per trial.
    from assaywatch.monitor.offline.load import load_runs

    runs, _ = load_runs([str(spans)])
    by = {}
    for run in runs:
        by.setdefault(run.key.scenario, []).append(run)
    half = by["test_stoch.py::test_half"]
    assert 5 <= len(half) <= 100
    assert sum(r.outcome.value == "fail" for r in half) > len(half) / 4


def test_inconclusive_as_failure_option(tmp_path: Path) -> None:
    r = _pytest(tmp_path, "--assaywatch-inconclusive=fail", "-k", "small_budget")
    assert "FAILED test_stoch.py::test_small_budget " in r.stdout + " "
    assert "XFAIL test_stoch.py::test_small_budget_xfail" in r.stdout  # decorator wins


def test_plugin_is_inert_and_light(tmp_path: Path) -> None:
    code = ("import sys, assaywatch.monitor.live.pytest_plugin as p; "
            "print(any(m.startswith(('assaywatch.analyzers', 'opentelemetry.sdk', 'numpy')) "
            "for m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stderr
