"""Run records, alarm ids, checkpoints and the kafka: config section (no broker needed)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.config import ConfigError
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.scaleout.records import (
    PartitionState,
    RecordError,
    alarm_id,
    decode_run,
    decode_state,
    encode_run,
    encode_state,
    partition_key,
)
from assaywatch.monitor.scaleout.settings import KafkaSettings, load_config
from tests.scaleout.runs_fixture import CONFIG, recorded_runs


def test_run_record_round_trip_is_exact() -> None:
    runs = recorded_runs()
    assert len(runs) == 360
    for run in runs:
        data = encode_run(run)
        assert decode_run(data) == run  # every field, floats bit for bit
        doc = json.loads(data)
        assert doc["v"] == 1
    # the evaluators' scores and labels travel too (the detectors monitor them)
    judged = dataclasses.replace(runs[0], scores={"helpfulness": 0.8125},
                                 labels={"safety": "unsafe"})
    assert decode_run(encode_run(judged)) == judged
    # compact: a run of a few steps is a few hundred bytes
    sizes = sorted(len(encode_run(r)) for r in runs)
    assert sizes[len(sizes) // 2] < 2000, sizes[len(sizes) // 2]


def test_engine_over_decoded_records_equals_engine_over_runs() -> None:
    direct, decoded = [], []
    a = Engine(CONFIG.detectors, on_alarm=direct.append)
    b = Engine(CONFIG.detectors, on_alarm=decoded.append)
    for run in recorded_runs():
        a.process(run)
        b.process(decode_run(encode_run(run)))
    assert [e.to_dict() for e in direct] == [e.to_dict() for e in decoded]
    assert direct, "the fixture raises alarms"


def test_bad_records_are_refused() -> None:
    run = recorded_runs()[0]
    doc = json.loads(encode_run(run))
    for bad in (b"", b"[]", b"not json", json.dumps({**doc, "v": 2}).encode(),
                json.dumps({k: v for k, v in doc.items() if k != "steps"}).encode(),
                json.dumps({**doc, "outcome": "maybe"}).encode()):
        with pytest.raises(RecordError):
            decode_run(bad)
    for bad in (b"", b"{}\n", b'{"v": 9}\nxx', b'{"v": 1}\nnot a pickle'):
        with pytest.raises(RecordError):
            decode_state(bad)


def test_keys_and_ids() -> None:
    # every version of an agent's scenario in one partition (new versions inherit baselines)
    assert partition_key(StreamKey("a", "1", "s")) == partition_key(StreamKey("a", "2", "s"))
    assert partition_key(StreamKey("a", "1", "s")) != partition_key(StreamKey("a", "1", "t"))
    k = StreamKey("a", "1", "s")
    assert alarm_id(k, "sprt", 1) == alarm_id(StreamKey("a", "1", "s"), "sprt", 1)
    assert len({alarm_id(k, d, e) for d in ("sprt", "hotelling") for e in (1, 2)}) == 4


def test_checkpoint_round_trip() -> None:
    eng = Engine(CONFIG.detectors)
    for run in recorded_runs()[:200]:
        eng.process(run)
    streams, latest = eng.partition_state()
    st = PartitionState(3, next_offset=200, streams=streams, latest_frozen=latest)
    back = decode_state(encode_state(st))
    assert (back.partition, back.next_offset) == (3, 200)
    assert {k: s.n_runs for k, s in back.streams.items()} == {
        k: s.n_runs for k, s in st.streams.items()}


def test_kafka_section(tmp_path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text("detectors:\n  learn_runs: 50\nkafka:\n  bootstrap: k1:9092,k2:9092\n"
                 "  checkpoint_seconds: 2\n  client:\n    security.protocol: SSL\n")
    cfg, ks = load_config(str(p))
    assert cfg.detectors.learn_runs == 50
    assert ks.bootstrap == "k1:9092,k2:9092" and ks.checkpoint_seconds == 2.0
    assert ks.client == {"security.protocol": "SSL"}
    assert load_config(None)[1] == KafkaSettings()
    p.write_text("kafka:\n  bootstrp: x\n")
    with pytest.raises(ConfigError, match="bootstrp"):
        load_config(str(p))
    p.write_text("kafka:\n  transactions: maybe\n")
    with pytest.raises(ConfigError, match="transactions"):
        load_config(str(p))
    # every option is documented
    assert all(f.metadata.get("doc") for f in dataclasses.fields(KafkaSettings))
