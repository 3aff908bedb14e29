"""The detector's reorder window (``kafka.reorder_seconds``), on a real broker: run records
that land out of order (as after an assembler crash, or from two assemblers closing runs of
one stream close together) are processed in (end time, run id) order, as replay does, also
across a kill -9 of the worker while records are held (they are part of its checkpoint or
read again from the committed offset).

One stream's 160 runs end one second apart; each block of three is produced in reverse (a
run lands up to 2 s of end time late), with the pass rate falling from 0.9 to 0.5 halfway so
alarms fire. The worker holds records 3 s of end time. Expected: the alarms and the stream's
run-id chain of an Engine fed the runs sorted by end time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.scaleout.records import alarm_id, chain_step, encode_run, partition_key
from assaywatch.monitor.scaleout.settings import load_config
from tests.analyzers.simagent import simulate_runs
from tests.scaleout import harness as h

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG = """
detectors:
  learn_runs: 40
  arl0: 200
  delta: 0.2
kafka:
  checkpoint_seconds: 0.5
  reorder_seconds: 3
"""
KEY = StreamKey("reorder-agent", "1.0", "refund")
N = 160


def _runs() -> list[Any]:
    rng = np.random.default_rng(7)
    runs = simulate_runs(N // 2, rng, key=KEY) + simulate_runs(N // 2, rng, key=KEY,
                                                               pass_rate=0.5)
    t0 = 1_790_000_000 * 10**9
    for i, r in enumerate(runs):
        r.start_ns, r.end_ns = t0 + i * 10**9 - 5 * 10**8, t0 + i * 10**9
    return runs


def test_runs_are_processed_in_end_time_order(broker: Any, tmp_path: Path) -> None:
    from confluent_kafka import Producer

    runs = _runs()
    arrival = [r for i in range(0, N, 3) for r in reversed(runs[i:i + 3])]
    assert [r.run_id for r in arrival] != [r.run_id for r in runs]  # out of order
    cfg_file = tmp_path / "monitor.yaml"
    cfg_file.write_text(CONFIG)
    cfg, _ = load_config(str(cfg_file))
    expected_alarms: list[tuple[str, int, str]] = []
    episodes: dict[str, int] = {}
    eng = Engine(cfg.detectors)
    chain = None
    for r in runs:  # replay's order
        chain = chain_step(chain, r.run_id)
        for ev in eng.process(r):
            episodes[ev.alarm_key] = episodes.get(ev.alarm_key, 0) + 1
            expected_alarms.append((ev.detector, ev.run_index,
                                    alarm_id(KEY, ev.alarm_key, episodes[ev.alarm_key])))
    assert expected_alarms, "the fixture raises alarms"

    names = h.make_topics(broker.bootstrap, "reorder", runs_parts=2)
    prod = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})

    def send(batch: list[Any]) -> None:
        for r in batch:
            prod.produce(names["runs"], encode_run(r), partition_key(r.key))
        prod.flush(30)

    worker = h.Worker("detect", broker.bootstrap, names, "det-0", cfg_file).start()
    try:
        send(arrival[:90])
        # held records: the last 3 s of end time are in the window while it runs
        h.wait_for(lambda: h.metric_sum([worker], "assaywatch_kafka_runs_processed_total")
                   >= 80, 60, "the first runs processed")
        worker.kill()  # kill -9 with records held
        worker.start()
        send(arrival[90:])
        h.wait_for(lambda: sum(st.runs_processed for st in
                               h.final_states(broker.bootstrap, names).values()) >= N,
                   90, "every run processed (the window flushed after 3 s without runs)",
                   poll=1.0)
        assert worker.stop() == 0, worker.log()[-3000:]
    except BaseException:
        print(worker.log()[-6000:])
        worker.kill()
        raise
    states = h.final_states(broker.bootstrap, names)
    st = next(s for s in states.values() if KEY in s.chains)
    assert st.chains[KEY] == chain  # the same runs, once each, in end-time order
    assert st.pending == []
    alarms, _ = h.alarms_from_topic(broker.bootstrap, names["alarms"])
    got = sorted((a["detector"], a["run_index"], a["id"]) for a in alarms)
    assert got == sorted(expected_alarms)
