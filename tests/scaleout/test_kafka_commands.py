"""Re-baseline and stream deletion over Kafka, on a real broker: ``POST /api/rebaseline`` (and
``/api/streams/delete``) to a detector worker writes a command record to the runs topic with
the stream's key; the worker that owns the stream (here deliberately not the one asked)
applies it in order with the stream's runs.

Two ``assaywatch kafka detect`` subprocesses share the runs topic; run records are produced
straight to it (``records.encode_run``, keyed as assemblers key them). One stream learns a
baseline of 40 runs and monitors; a re-baseline sent to the other worker sends it back to
learning on its owner, 40 more runs freeze a new baseline, and a deletion removes it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.scaleout.records import encode_run, partition_key
from tests.analyzers.simagent import simulate_runs
from tests.scaleout import harness as h

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG = """
detectors:
  learn_runs: 40
kafka:
  checkpoint_seconds: 0.5
"""
TOKEN = "commands-test-token-0123456789"
KEY = StreamKey("cmd-agent", "1.0", "refund")


def _post(worker: h.Worker, path: str, token: str | None) -> tuple[int, dict[str, Any]]:
    body = json.dumps(KEY.as_labels()).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://{worker.metrics}{path}", data=body,
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def _state(worker: h.Worker) -> str | None:
    for (name, labels), v in worker.scrape().items():
        d = dict(labels)
        if name == "assaywatch_stream_state" and d.get("agent") == KEY.agent and v == 1:
            return d["state"]
    return None


def _runs(worker: h.Worker) -> float:
    return sum(v for (name, labels), v in worker.scrape().items()
               if name == "assaywatch_runs_total" and dict(labels).get("agent") == KEY.agent)


def test_rebaseline_and_delete_over_kafka(broker: Any, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka import Producer

    monkeypatch.setenv("ASSAYWATCH_API_TOKEN", TOKEN)
    names = h.make_topics(broker.bootstrap, "cmds", runs_parts=4)
    cfg = tmp_path / "monitor.yaml"
    cfg.write_text(CONFIG)
    workers = [h.Worker("detect", broker.bootstrap, names, f"det-{i}", cfg).start()
               for i in range(2)]
    prod = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    rng = np.random.default_rng(3)

    def send(n: int) -> None:
        for run in simulate_runs(n, rng, key=KEY):
            prod.produce(names["runs"], encode_run(run), partition_key(run.key))
        prod.flush(30)

    try:
        send(50)
        h.wait_for(lambda: any(_state(w) == "monitoring" for w in workers), 60,
                   "the stream monitoring on its owner")
        owner = next(w for w in workers if _state(w) == "monitoring")
        other = next(w for w in workers if w is not owner)
        assert _state(other) is None  # the stream lives on one worker
        assert _runs(owner) == 50

        # no token: refused, nothing written
        assert _post(other, "/api/rebaseline", None)[0] == 401
        # to the worker that does not own the stream: written to the runs topic ...
        code, answer = _post(other, "/api/rebaseline", TOKEN)
        assert (code, answer.get("rebaselined")) == (200, True), answer
        # ... and applied by the owner, in order: back to learning
        h.wait_for(lambda: _state(owner) == "learning", 30, "the re-baseline applied")
        send(40)
        h.wait_for(lambda: _state(owner) == "monitoring", 60, "a new baseline frozen")
        # the stream started afresh at the re-baseline (as in the single monitor)
        assert _runs(owner) == 40 and _state(other) is None

        code, answer = _post(owner, "/api/streams/delete", TOKEN)
        assert (code, answer.get("deleted")) == (200, True), answer
        h.wait_for(lambda: _state(owner) is None, 30, "the stream deleted")
        removed = sum(v for (name, labels), v in owner.scrape().items()
                      if name == "assaywatch_streams_removed_total"
                      and dict(labels).get("reason") == "deleted")
        assert removed == 1
        # a command for a stream nobody has is written, then counted by its partition's owner
        assert _post(owner, "/api/rebaseline", TOKEN)[0] == 200
        h.wait_for(lambda: h.metric_sum(workers, "assaywatch_spans_dropped_total") >= 1, 30,
                   "the command without a stream counted")
        dropped = {dict(labels).get("reason"): v for w in workers
                   for (name, labels), v in w.scrape().items()
                   if name == "assaywatch_spans_dropped_total" and v}
        assert dropped == {"command_without_stream": 1.0}, dropped
        for w in workers:
            assert w.stop() == 0, w.log()[-3000:]
    except BaseException:
        for w in workers:
            print(f"--- {w.instance}\n{w.log()[-4000:]}")
            w.kill()
        raise
