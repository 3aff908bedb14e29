"""The scale-out scenario: agents -> the real Collector -> Kafka -> assemblers -> detector
workers, with optional kills, and its comparison with one ``assaywatch replay``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from assaywatch.monitor.scaleout.settings import load_config
from tests.e2e.otel_agent import AgentBehaviour
from tests.scaleout import harness as h

LEARN = 40
ROUNDS = 80
SWITCH = 45
#: Spacing: a round (one run of every stream) is emitted only once every run of the previous
#: round is in the runs topic (``RunsWatcher``), so a stream's runs land there in the order
#: they ran, the order ``replay`` processes them in (monitor/scaleout/assembler.py,
#: "Ordering"); a fixed wall-time gap is only probably enough on a loaded machine.
CONFIG = f"""
assembler:
  grace_seconds: 0.3
detectors:
  learn_runs: {LEARN}
  arl0: 200
  delta: 0.2
  hotelling_window: 30
  hotelling_every: 10
kafka:
  checkpoint_seconds: 1.0
  commit_seconds: 1.0
  transaction_timeout_ms: 10000
"""

GOOD = AgentBehaviour(pass_rate=0.9)
AFTER = {
    "drop-agent": AgentBehaviour(pass_rate=0.3),
    "mix-agent": AgentBehaviour(pass_rate=0.9, tools={
        "lookup_order": 0.0, "search_kb": 0.1, "refund": 0.9}),
    "steady-a": GOOD, "steady-b": GOOD, "steady-c": GOOD, "steady-d": GOOD,
}


def streams() -> dict[str, Callable[[int], AgentBehaviour]]:
    return {a: (lambda i, b=b: b if i >= SWITCH else GOOD) for a, b in AFTER.items()}


@dataclass
class Cluster:
    bootstrap: str
    names: dict
    config: Path
    assemblers: list[h.Worker] = field(default_factory=list)
    detectors: list[h.Worker] = field(default_factory=list)
    agents: Any = None
    log: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {what}")
        print(self.log[-1], flush=True)

    def start(self, n_assemblers: int, n_detectors: int, assembler_args: tuple[str, ...] = (),
              detector_args: tuple[str, ...] = ()) -> None:
        for i in range(n_assemblers):
            self.assemblers.append(h.Worker("assemble", self.bootstrap, self.names,
                                            f"asm-{i}", self.config, *assembler_args))
        for i in range(n_detectors):
            self.detectors.append(h.Worker("detect", self.bootstrap, self.names,
                                           f"det-{i}", self.config, *detector_args))
        for w in self.assemblers + self.detectors:
            w.proc = None
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(8) as pool:  # python start-up in parallel
            list(pool.map(lambda w: w.start(), self.assemblers + self.detectors))

    def wait_stable(self, spans_parts: int = 4, runs_parts: int = 6,
                    timeout: float = 60) -> None:
        """Until every partition is assigned and every worker has some."""
        def spread(workers: list[h.Worker], total: int) -> bool:
            live = [w for w in workers if w.alive()]
            try:
                n = [h.metric_sum([w], "assaywatch_kafka_partitions") for w in live]
            except OSError:
                return False
            return sum(n) == total and all(n)

        h.wait_for(lambda: spread(self.assemblers, spans_parts)
                   and spread(self.detectors, runs_parts), timeout, "a stable assignment")

    def runs_seen(self) -> float:
        return h.metric_sum(self.detectors, "assaywatch_runs_total")

    def stop(self) -> dict[str, int]:
        return {w.instance: w.stop() for w in self.assemblers + self.detectors if w.proc}

    def logs(self) -> str:
        return "\n".join(f"--- {w.instance}\n{w.log()[-20000:]}"
                         for w in self.assemblers + self.detectors)


def run_scenario(broker: Any, tmp: Path, prefix: str, n_assemblers: int, n_detectors: int,
                 before: dict[int, Callable[[Cluster], None]] | None = None,
                 after: dict[int, Callable[[Cluster], None]] | None = None,
                 assembler_args: tuple[str, ...] = (), detector_args: tuple[str, ...] = (),
                 ) -> dict[str, Any]:
    """Run the whole chain; ``before[i]`` / ``after[i]`` are called with the cluster before
    and right after round ``i`` is emitted. Returns what the comparison needs."""
    from tests.infra.otelcol import otel_collector

    t0 = time.monotonic()
    cfg_path = tmp / "monitor.yaml"
    cfg_path.write_text(CONFIG)
    names = h.make_topics(broker.bootstrap, prefix)
    cluster = Cluster(broker.bootstrap, names, cfg_path)
    spans_file = tmp / "spans.jsonl"
    timings: dict[str, float] = {}
    try:
        with otel_collector(h.collector_config(tmp, names["spans"], names["logs"]),
                            env={"ASSAYWATCH_KAFKA_BOOTSTRAP": broker.bootstrap}) as col:
            cluster.start(n_assemblers, n_detectors, assembler_args, detector_args)
            cluster.wait_stable()
            timings["started"] = time.monotonic() - t0
            agents = h.Agents(col.grpc_endpoint)
            # warm-up: the first record through each client (the Collector's exporter, the
            # assemblers' producers) waits for metadata and producer ids; one run each of
            # eight one-run streams takes that wait outside the measured streams
            agents.round({f"warmup-{i}": GOOD for i in range(8)}, 0)
            h.wait_for(lambda: cluster.runs_seen() >= 8, 60, "the warm-up runs")
            timings["warm"] = time.monotonic() - t0
            plan = streams()
            cluster.agents = agents
            watcher = h.RunsWatcher(broker.bootstrap, names["runs"])
            try:
                for i in range(ROUNDS):
                    if before and i in before:
                        before[i](cluster)
                    agents.round(plan, i)
                    if after and i in after:
                        after[i](cluster)
                    watcher.wait(agents.emitted)
            finally:
                watcher.close()
            agents.close(spans_file)
            timings["emitted"] = time.monotonic() - t0
            total = agents.emitted
            h.wait_for(lambda: cluster.runs_seen() >= total, 60,
                       f"{total} runs at the detectors")
            timings["processed"] = time.monotonic() - t0
            codes = cluster.stop()
    except BaseException:
        print(cluster.logs())
        cluster.stop()
        raise
    cfg, _ = load_config(str(cfg_path))
    alarms, dups = h.alarms_from_topic(broker.bootstrap, names["alarms"])
    states = h.final_states(broker.bootstrap, names)
    timings["total"] = time.monotonic() - t0
    return {"cfg": cfg, "names": names, "cluster": cluster, "codes": codes,
            "alarms": alarms, "alarm_duplicates": dups, "states": states,
            "reference": h.replay_reference(spans_file, cfg), "spans_file": spans_file,
            "timings": timings, "runs": total}


def assert_equal_to_replay(res: dict[str, Any]) -> None:
    """Alarms, final state, counts, episodes and per-stream run order exactly as replay."""
    ref = res["reference"]
    assert res["runs"] == len(AFTER) * ROUNDS + 8
    # the comparison is not vacuous: both regressions alarmed
    agents = {a["agent"] for a in ref["alarms"]}
    assert {"drop-agent", "mix-agent"} <= agents, ref["alarms"]
    states = res["states"]
    # every stream's runs: the same runs, each once, in the same order (hash chains)
    chains = {k: c for st in states.values() for k, c in st.chains.items()}
    if chains != ref["chains"]:
        raise AssertionError(h.order_report(res["cluster"].bootstrap, res["names"],
                                            res["spans_file"]))
    # alarms: (stream, detector, run index) and episode, run id and deterministic id
    mine, theirs = set(h.alarm_keys(res["alarms"])), set(h.alarm_keys(ref["alarms"]))
    assert mine == theirs, (sorted(mine - theirs), sorted(theirs - mine))
    # final state and counts: every per-stream metric sample, bit for bit
    group = h.group_of(states, res["cfg"])
    assert h.stream_samples(group) == h.stream_samples(ref["engine"])
    for st in ref["engine"].streams():
        mine = group.stream(st.key)
        assert mine is not None
        assert (mine.n_runs, dict(mine.outcomes), mine.monitored_runs,
                dict(mine.alarms_total)) == (st.n_runs, dict(st.outcomes),
                                            st.monitored_runs, dict(st.alarms_total))
