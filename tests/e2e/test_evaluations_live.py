"""Evaluations as signals, live and with real parts (issue 16).

An agent using the real OTel SDK (tests/e2e/otel_agent.py: ``TracerProvider``, batch span
processor, OTLP/gRPC exporter) sends the runs of three streams (scenarios ``steady``,
``notch`` and ``lumpy``) to a real ``assaywatch monitor`` process, ``RATE`` runs a second
each. All three pass 90% of their runs (``assaywatch.evaluation.passed``) from start to end.
A span processor of the agent hands the root ``invoke_agent`` span of each finished run
(trace id, span id, scenario, index) to a SEPARATE judge process
(tests/e2e/evaluation_judge.py) which, 1-30 s later (uniform), emits one
``gen_ai.evaluation.result`` event named ``helpfulness`` on that span's context through its
own ``LoggerProvider`` and the real OTLP log exporter. Scores are lumpy (45% exactly 1.0, the
rest on 0.5-0.9). From run ``CHANGE_AT`` on -- after the streams' baselines froze -- two
judges score about 0.1 lower, pass rates unchanged:

- ``notch``: every answer one level lower (1.0 becomes 0.9);
- ``lumpy``: the same share of perfect 1.0 marks, the other answers much worse (the way an
  LLM judge's scores usually fall).

The scenario runs once (about 1.5 minutes, module fixture); the tests check its parts:
every evaluation joined its run late and was counted (as a score of its stream, or, for a
learning run judged after its baseline froze, set aside as
``spans_dropped_total{reason="evaluation_of_learning_run"}``); each evaluator was learned into its
stream's baseline (an offline replica of the detector, fed the scores in the order the
judge sent them, ends on the monitor's own statistic); ``steady`` raises no evaluation alarm
and no stream's pass-rate CUSUM fires; both drops raise
``assaywatch_alarm{detector="evaluation",evaluator="helpfulness"}`` within ``DELAY_BOUND``
post-change scores. ``pytest -s`` prints the measured figures.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from assaywatch.analyzers.detectors.score import ScoreDropCUSUM, ScoreSummary
from tests.e2e import evaluation_judge as judge_mod
from tests.e2e.otel_agent import AgentBehaviour, MonitorProcess, emit_run, make_provider
from tests.e2e.rawotlp import scrape, value

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EVALUATOR = "helpfulness"
STEADY, NOTCH, LUMPY = "steady", "notch", "lumpy"
SCENARIOS = (STEADY, NOTCH, LUMPY)
#: Runs per second of each stream.
RATE = 32.0
#: Runs of each stream learned into its baseline: 20 s at RATE, after which about a third
#: of their scores have arrived (1-30 s delays); the rest arrive while it is monitored.
LEARN = 640
#: Runs of each stream: 30 s of runs after the baseline.
RUNS = LEARN + 960
#: First run scored lower by the changed judges.
CHANGE_AT = LEARN
ARL0 = 10_000
#: Detectors with a share of the budget here: cusum_pass_rate, cusum_fingerprint and one
#: evaluator, equal default shares (engine._build_score_detectors).
EVALUATOR_SHARE = 1 / 3
#: The engine's confidence for the evaluator's baseline bound: 1 - (1 - 0.9) / 3.
CONFIDENCE = 1 - (1 - 0.9) / 3
MIN_DROP = 0.1
SEED = 16
MIN_DELAY, MAX_DELAY = 1.0, 30.0
#: Post-change scores within which a drop of ``MIN_DROP`` must raise the alarm. From the
#: detector: its mean delay is ``h`` over its log-growth per post-change score (printed;
#: about 7.5 / 0.03 = 250 scores on the lumpy drop with a baseline of ~200 scores, 70 on
#: the notch drop); the late in-control scores of the learning runs (about 430 of them
#: arrive after the baseline froze) are set aside, not fed to the detector. The bound is
#: 2.5x the slower drop's mean delay, and fewer than the 960 post-change scores the test
#: sends.
DELAY_BOUND = 600
CONFIG = f"""
assembler:
  grace_seconds: 0.5
detectors:
  learn_runs: {LEARN}
  arl0: {ARL0}
evaluations:
  join_window_seconds: 180
  min_drop: {MIN_DROP}
checkpoint_seconds: 5
"""
BEHAVIOUR = AgentBehaviour(pass_rate=0.9, latency_scale=0.01)
JOIN_OUTCOMES = ("on_trace", "late", "unmatched", "invalid", "waiting_limit",
                 "digest_evicted")


class HandToJudge(SpanProcessor):
    """Hands each finished root agent span to the judge (one JSON line on its stdin)."""

    def __init__(self, judge: subprocess.Popen[str]) -> None:
        self.judge = judge
        self.count: dict[str, int] = {}
        #: when the run being emitted ends, in seconds since the agent started (its
        #: schedule, or later when the agent runs late): the judge's clock for the delays
        self.at = 0.0
        self.lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        if span.parent is not None or attrs.get("gen_ai.operation.name") != "invoke_agent":
            return
        scenario = str(attrs["assaywatch.scenario"])
        assert span.context is not None and self.judge.stdin is not None
        with self.lock:
            index = self.count.get(scenario, 0)
            self.count[scenario] = index + 1
            self.judge.stdin.write(json.dumps({
                "trace_id": format(span.context.trace_id, "032x"),
                "span_id": format(span.context.span_id, "016x"),
                "scenario": scenario, "index": index, "at": self.at}) + "\n")
            self.judge.stdin.flush()


def stream_labels(scenario: str) -> dict[str, str]:
    return {"agent": "support-agent", "version": "1.0", "scenario": scenario}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def run_scenario(tmp: Path) -> dict[str, Any]:
    """The live run: monitor, agent, judge; what the monitor and the judge report."""
    cfg = tmp / "monitor.yaml"
    cfg.write_text(CONFIG)
    state = tmp / "state"
    t_start = time.monotonic()
    mon = MonitorProcess("--config", str(cfg), "--state-dir", str(state),
                         "--log-level", "WARNING").start()
    judge_err = (tmp / "judge.stderr").open("w+")
    judge = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.evaluation_judge",
         "--endpoint", mon.addresses["otlp_grpc"], "--seed", str(SEED),
         "--evaluator", EVALUATOR, "--change", f"{NOTCH}=notch", "--change",
         f"{LUMPY}=lumpy", "--change-at", str(CHANGE_AT),
         "--min-delay", str(MIN_DELAY), "--max-delay", str(MAX_DELAY),
         "--report", str(tmp / "judge.json")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=judge_err, text=True,
        cwd=ROOT)
    provider = None
    seen: dict[str, float] = {}  # "<scenario>/<detector>" -> first time its alarm was 1
    stop = threading.Event()
    out: dict[str, Any] = {}

    def watch() -> None:
        while not stop.wait(0.5):
            try:
                s = scrape(mon.addresses["metrics"])
            except OSError:
                continue
            for scen in SCENARIOS:
                for det, ev in (("evaluation", EVALUATOR), ("cusum_pass_rate", "")):
                    if value(s, "assaywatch_alarm", detector=det, evaluator=ev,
                             **stream_labels(scen)) >= 1:
                        seen.setdefault(f"{scen}/{det}", time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        assert judge.stdout is not None
        assert judge.stdout.readline().strip() == "judge ready", "the judge did not start"
        provider, _ = make_provider(mon.addresses["otlp_grpc"], "grpc")
        hand = HandToJudge(judge)
        provider.add_span_processor(hand)
        tracer = provider.get_tracer("assaywatch-tests.agent")
        rng = np.random.default_rng(SEED)
        watcher.start()
        t0 = time.monotonic()
        for i in range(RUNS):
            if i == CHANGE_AT:
                out["change_time"] = time.monotonic()
            # the schedule (the judge's order then depends on the seed only), unless the
            # agent runs more than 0.5 s late
            late = time.monotonic() - t0 - i / RATE
            hand.at = i / RATE + (late if late > 0.5 else 0.0)
            for scen in SCENARIOS:
                emit_run(tracer, rng, "support-agent", "1.0", scen, BEHAVIOUR, time.time_ns())
            lag = t0 + (i + 1) / RATE - time.monotonic()
            if lag > 0:
                time.sleep(lag)
        out["agent_s"] = time.monotonic() - t0
        provider.force_flush()
        assert judge.stdin is not None
        judge.stdin.close()
        judge.wait(timeout=MAX_DELAY + 60)
        judge_err.seek(0)
        assert judge.returncode == 0, judge_err.read()[-3000:]
        out["judge"] = json.loads((tmp / "judge.json").read_text())

        def all_counted(s: Any) -> bool:
            counted = sum(value(s, "assaywatch_evaluations_total", evaluator=EVALUATOR,
                                **stream_labels(sc)) for sc in SCENARIOS)
            aside = value(s, "assaywatch_spans_dropped_total",
                          reason="evaluation_of_learning_run")
            return counted + aside >= len(SCENARIOS) * RUNS

        deadline = time.monotonic() + 30
        s = scrape(mon.addresses["metrics"])
        while not all_counted(s) and time.monotonic() < deadline:
            time.sleep(0.5)
            s = scrape(mon.addresses["metrics"])
        out["metrics"] = s
        out["metrics_text"] = get_text(mon.url("/metrics"))
        out["page"] = get_text(mon.url("/"))
        data = get_json(mon.url("/api/streams"))
        out["streams"] = {st["scenario"]: st for st in
                          (data["streams"] if isinstance(data, dict) else data)}
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(timeout=15)
        if provider is not None:
            provider.shutdown()
        if judge.poll() is None:
            judge.kill()
            judge.wait()
        out["monitor_exit"] = mon.stop()
    events = state / "events.jsonl"
    out["onsets"] = [json.loads(line) for line in events.read_text().splitlines()
                     if line.strip()] if events.exists() else []
    out["seen"] = seen
    out["wall_s"] = time.monotonic() - t_start
    return out


def best_lambda_for(post: Sequence[float], m0: float) -> float:
    """The growth-optimal bet against the scores actually seen after the change (an oracle,
    for comparison only)."""
    ys, counts = np.unique(np.asarray(post, dtype=float), return_counts=True)
    ps = counts / counts.sum()
    lams = np.linspace(0.0, 0.99 / max(1 - m0, 1e-3), 2001)[1:]
    growth = [float(np.dot(ps, np.log1p(lam * (m0 - ys)))) for lam in lams]
    return float(lams[int(np.argmax(growth))])


def replay(emitted: Sequence[Sequence[Any]], scenario: str, n_b: int,
           h: float) -> dict[str, Any]:
    """The stream's detector rebuilt offline: the judge's scores of ``scenario`` in the
    order they were sent (the order the monitor received them: one exporter, batches in
    order), the first ``n_b`` (those that arrived while it learned) as its baseline, the
    rest fed to a ``ScoreDropCUSUM`` built as the engine builds it, with the monitor's
    threshold ``h`` (calibrated on the baseline in the monitor's worker)."""
    mine = [e for e in emitted if e[0] == scenario]
    scores = [float(e[2]) for e in mine]
    summary = ScoreSummary.from_scores(scores[:n_b])
    det = ScoreDropCUSUM(summary, shift=MIN_DROP, arl0=ARL0 / EVALUATOR_SHARE,
                         confidence=CONFIDENCE, h=h)
    post = [x for e, x in zip(mine, scores, strict=True) if e[1] >= CHANGE_AT]
    lam_opt = best_lambda_for(post, det.m0) if post else math.nan
    w_opt, first, first_opt, top = 0.0, None, None, 0.0
    for k in range(n_b, len(mine)):
        if mine[k][1] < LEARN:
            continue  # a learning run judged after the freeze: set aside by the engine
        det.update(scores[k])
        top = max(top, det.statistic)
        if det.drift_detected and first is None:
            first = k
        w_opt = max(0.0, w_opt + math.log1p(lam_opt * (det.m0 - scores[k])))
        if w_opt >= det.h and first_opt is None:
            first_opt = k

    def post_count(k: int | None) -> int | None:
        return None if k is None else sum(1 for e in mine[:k + 1] if e[1] >= CHANGE_AT)

    growth = float(np.mean(np.log1p(det.lam * (det.m0 - np.asarray(post))))) if post \
        else math.nan
    # scores of learning runs that arrived after the baseline froze: set aside
    late_learning = sum(1 for e in mine[n_b:] if e[1] < CHANGE_AT)
    return {"baseline_mean": summary.mean, "n_b": n_b, "lambda": det.lam, "m0": det.m0,
            "h": det.h, "final": det.statistic, "max": top,
            "alarm_run_id": None if first is None else mine[first][5],
            "alarm_after": post_count(first), "growth": growth,
            "lambda_opt": lam_opt, "alarm_after_opt": post_count(first_opt),
            "post_mean": float(np.mean(post)) if post else math.nan,
            "late_learning": late_learning,
            "run_ids": [e[5] for e in mine], "indexes": [e[1] for e in mine]}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    assert abs(judge_mod.population_mean(False) - judge_mod.population_mean(True)
               - MIN_DROP) < 0.005
    assert abs(judge_mod.population_mean(False) - judge_mod.notch_mean() - MIN_DROP) < 0.005
    out = run_scenario(tmp_path_factory.mktemp("evaluations-live"))
    s = out["metrics"]
    emitted = out["judge"]["emitted"]
    out["counted"] = {sc: value(s, "assaywatch_evaluations_total", evaluator=EVALUATOR,
                                **stream_labels(sc)) for sc in SCENARIOS}
    out["joins"] = {o: value(s, "assaywatch_evaluation_joins_total", outcome=o)
                    for o in JOIN_OUTCOMES}
    out["runs"] = {sc: value(s, "assaywatch_runs_total", **stream_labels(sc))
                   for sc in SCENARIOS}
    out["evaluator"] = {sc: next((e for e in out["streams"][sc]["evaluators"]
                                  if e["name"] == EVALUATOR), None) for sc in SCENARIOS}
    out["replay"] = {}
    for sc in SCENARIOS:
        ev = out["evaluator"][sc]
        n_b = int(((ev or {}).get("baseline") or {}).get("n") or 0)
        out["replay"][sc] = replay(emitted, sc, n_b, float(ev["threshold"])) \
            if n_b >= 2 and ev["threshold"] is not None else None
    out["alarms"] = {}
    for sc in (NOTCH, LUMPY):
        onset = next((o for o in out["onsets"] if o["scenario"] == sc
                      and o["detector"] == "evaluation"), None)
        rep = out["replay"][sc]
        after = None
        if onset is not None and rep is not None and onset["run_id"] in rep["run_ids"]:
            k = rep["run_ids"].index(onset["run_id"])
            after = sum(1 for ix in rep["indexes"][:k + 1] if ix >= CHANGE_AT)
        out["alarms"][sc] = {"onset": onset, "after": after,
                             "seen_s": out["seen"].get(f"{sc}/evaluation", math.nan)
                             - out.get("change_time", math.nan)}
    _print_figures(out)
    yield out


def _print_figures(out: dict[str, Any]) -> None:
    s = out["metrics"]
    recent = {sc: round(value(s, "assaywatch_evaluation_score", evaluator=EVALUATOR,
                              **stream_labels(sc)), 3) for sc in SCENARIOS}
    print(f"\nevaluations live: {len(SCENARIOS) * RUNS} runs sent in {out['agent_s']:.1f} s, "
          f"wall {out['wall_s']:.1f} s (monitor start to stop)")
    print(f"  runs counted {out['runs']}; evaluations counted {out['counted']}")
    print(f"  joins {out['joins']}; judge exported {out['judge']['exported']}, failed "
          f"{out['judge']['failed']}")
    print(f"  recent mean scores {recent}")
    for sc in SCENARIOS:
        rep = out["replay"][sc]
        if rep is None:
            print(f"  {sc}: no evaluator baseline")
            continue
        print(f"  {sc}: baseline {rep['n_b']} scores (of {LEARN} learning runs; "
              f"{rep['late_learning']} arrived after it froze) mean "
              f"{rep['baseline_mean']:.3f}, m0 {rep['m0']:.3f}, lambda {rep['lambda']:.2f}, "
              f"h {rep['h']:.2f}; post-change mean {rep['post_mean']:.3f}, log-growth per "
              f"post-change score {rep['growth']:+.3f} (h / growth = "
              f"{rep['h'] / rep['growth'] if rep['growth'] > 0 else math.inf:.0f} scores); "
              f"statistic max {rep['max']:.2f}, "
              f"final {rep['final']:.2f}; replica alarms after {rep['alarm_after']} "
              f"post-change scores, a growth-optimal bet (lambda {rep['lambda_opt']:.2f}) "
              f"after {rep['alarm_after_opt']}")
    for sc, a in out["alarms"].items():
        if a["onset"] is None:
            print(f"  {sc}: no evaluation alarm")
        else:
            print(f"  {sc}: evaluation alarm after {a['after']} post-change scores (bound "
                  f"{DELAY_BOUND}), seen {a['seen_s']:.1f} s after the change "
                  f"({a['seen_s'] * RATE:.0f} runs of the stream)")
    onsets = [(o["scenario"], o["detector"], o.get("evaluator", "")) for o in out["onsets"]]
    print(f"  onsets {onsets}")


def test_every_evaluation_joins_its_run_and_is_counted(live: dict[str, Any]) -> None:
    rc, err = live["monitor_exit"]
    assert rc == 0, err[-3000:]
    judge = live["judge"]
    per_stream = {sc: sum(1 for e in judge["emitted"] if e[0] == sc) for sc in SCENARIOS}
    assert per_stream == dict.fromkeys(SCENARIOS, RUNS), per_stream
    assert judge["failed"] == 0 and judge["exported"] == len(SCENARIOS) * RUNS, judge
    assert live["runs"] == dict.fromkeys(SCENARIOS, RUNS), live["runs"]
    aside = value(live["metrics"], "assaywatch_spans_dropped_total",
                  reason="evaluation_of_learning_run")
    late_learning = {sc: live["replay"][sc]["late_learning"] for sc in SCENARIOS}
    assert aside == sum(late_learning.values()), (aside, late_learning)
    assert live["counted"] == {sc: RUNS - late_learning[sc] for sc in SCENARIOS}, \
        (live["counted"], late_learning)
    joins = live["joins"]
    # the judge answers 1-30 s after the run: after its trace closed (grace 0.5 s)
    assert joins["late"] + joins["on_trace"] == len(SCENARIOS) * RUNS, joins
    assert joins["late"] >= 0.99 * len(SCENARIOS) * RUNS, joins
    assert joins["unmatched"] == joins["invalid"] == joins["waiting_limit"] == 0, joins
    assert joins["digest_evicted"] == 0, joins
    # the judge's explanation is stored nowhere
    seen_text = live["page"] + live["metrics_text"] + json.dumps(live["streams"])
    assert judge_mod.EXPLANATION_MARKER not in seen_text


def test_each_evaluator_is_learned_then_monitored(live: dict[str, Any]) -> None:
    for sc in SCENARIOS:
        ev = live["evaluator"][sc]
        assert ev is not None and ev["monitored"], ev
        n_b = ev["baseline"]["n"]
        # about a third of the learning runs' scores arrive before the baseline freezes
        assert 0.15 * LEARN <= n_b <= 0.6 * LEARN, (sc, n_b)
        rep = live["replay"][sc]
        # the replica learned the same scores and fed the rest in the monitor's order
        assert rep["baseline_mean"] == pytest.approx(ev["baseline"]["mean"], abs=1e-9), sc
        assert rep["final"] == pytest.approx(ev["statistic"], rel=1e-6, abs=1e-9), sc
        assert rep["h"] == pytest.approx(ev["threshold"]), sc


def test_unchanged_stream_and_pass_rates_stay_quiet(live: dict[str, Any]) -> None:
    s = live["metrics"]
    assert not [o for o in live["onsets"] if o["scenario"] == STEADY
                and o["detector"] == "evaluation"], live["onsets"]
    assert f"{STEADY}/evaluation" not in live["seen"]
    assert value(s, "assaywatch_alarms_total", detector="evaluation", evaluator=EVALUATOR,
                 **stream_labels(STEADY)) == 0
    for sc in SCENARIOS:  # the pass rate never moved: its CUSUM never fired
        assert value(s, "assaywatch_alarms_total", detector="cusum_pass_rate",
                     **stream_labels(sc)) == 0, sc
        assert f"{sc}/cusum_pass_rate" not in live["seen"], sc


def _assert_alarm_within_bound(live: dict[str, Any], scenario: str) -> None:
    a = live["alarms"][scenario]
    assert a["onset"] is not None, f"{scenario}: the drop raised no evaluation alarm"
    assert a["onset"]["evaluator"] == EVALUATOR
    assert value(live["metrics"], "assaywatch_alarm", detector="evaluation",
                 evaluator=EVALUATOR, **stream_labels(scenario)) == 1
    assert a["onset"]["run_id"] == live["replay"][scenario]["alarm_run_id"]
    assert a["after"] is not None and a["after"] <= DELAY_BOUND, a["after"]


def test_a_notch_drop_alarms_within_the_bound(live: dict[str, Any]) -> None:
    _assert_alarm_within_bound(live, NOTCH)


def test_a_lumpy_drop_alarms_within_the_bound(live: dict[str, Any]) -> None:
    _assert_alarm_within_bound(live, LUMPY)
