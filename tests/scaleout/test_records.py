"""Run records, alarm ids, checkpoints and the kafka: config section (no broker needed)."""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict

import pytest

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.config import ConfigError
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.pipeline.join import LateEvaluation
from assaywatch.monitor.pipeline.outcome import Evaluation
from assaywatch.monitor.scaleout.records import (
    PartitionState,
    RecordError,
    alarm_id,
    decode_record,
    decode_run,
    decode_state,
    encode_evaluation,
    encode_run,
    encode_state,
    evaluation_id,
    evaluator_names,
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
    for bad in (b"", b"{}\n", b'{"v": 9}\nxx', b'{"v": 1}\nnot a pickle',
                b'{"v": 2}\nnot json', b'{"v": 2}\n["o", "os:system", "command", "true"]',
                b'{"v": 2}\n["d"]'):
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


def test_evaluation_record_round_trip_and_kind() -> None:
    key = StreamKey("support", "1.2", "refund")
    late = LateEvaluation("0af7651916cd43dd8448eb211c80319c:b7ad6b7169203331", key,
                          Evaluation(name="helpfulness", score=0.8125), {"helpfulness": 0.8125},
                          start_ns=1_765_000_000_123_456_789)
    data = encode_evaluation(late)
    assert decode_record(data) == late
    doc = json.loads(data)
    assert doc["t"] == "evaluation" and doc["run"] == late.run_id
    # same partition as its run: the stream's key
    run = recorded_runs()[0]
    assert partition_key(late.key) == partition_key(StreamKey("support", "2.0", "refund"))
    # a label, a pass flag, and a score the engine cannot take (infinite) all travel
    labelled = LateEvaluation("t:s", key, Evaluation(name="safety", label="unsafe"), {},
                              labels={"safety": "unsafe"})
    assert decode_record(encode_evaluation(labelled)) == labelled
    flag = LateEvaluation("t:s", key, Evaluation(passed=False), {})
    assert decode_record(encode_evaluation(flag)) == flag
    inf = LateEvaluation("t:s", key, Evaluation(name="x", score=float("inf")), {})
    assert decode_record(encode_evaluation(inf)).evaluation.score == float("inf")
    # a run record (no "t", as every record written before evaluations) is still a run
    assert decode_record(encode_run(run)) == run
    with pytest.raises(RecordError, match="evaluation"):
        decode_run(data)  # an evaluation is never taken for a run
    # identities: the evaluator names, whatever their order; a flag-only one by its name
    assert evaluation_id("r", ["b", "a"]) == evaluation_id("r", ["a", "b"]) != \
        evaluation_id("r", ["a"])
    assert evaluator_names(late) == ["helpfulness"]
    assert evaluator_names(flag) == ["unnamed"]


def test_bad_evaluation_records_are_refused() -> None:
    key = StreamKey("a", "1", "s")
    doc = json.loads(encode_evaluation(LateEvaluation("t:s", key, Evaluation(score=0.5),
                                                      {"unnamed": 0.5})))
    for bad in ({**doc, "t": "verdict"}, {**doc, "v": 2},
                {k: v for k, v in doc.items() if k != "run"},
                {**doc, "ev": [None, None, "high", None]}, {**doc, "ev": [1, None, 0.5, None]},
                {**doc, "ev": [None, None, 0.5, "yes"]}, {**doc, "start": "now"},
                {**doc, "ev": [None, None]}):
        with pytest.raises(RecordError):
            decode_record(json.dumps(bad).encode())
    # never any content: only the fields listed
    assert set(doc) == {"v", "t", "run", "agent", "version", "scenario", "start", "ev",
                        "scores"}


def test_checkpoint_from_before_recent_evaluations_loads() -> None:
    st = PartitionState(2, next_offset=7)
    st.recent_run_ids["r1"] = None
    del st.__dict__["recent_evaluations"]  # as written by a version without the field
    for data in (encode_state(st), legacy_pickled_state(st)):
        back = decode_state(data)
        assert back.recent_evaluations == OrderedDict()
        assert list(back.recent_run_ids) == ["r1"] and back.next_offset == 7


def legacy_pickled_state(st: PartitionState) -> bytes:
    """A checkpoint as the previous version wrote it: schema 1, a pickle."""
    import pickle

    header = json.dumps({"v": 1, "partition": st.partition, "next_offset": st.next_offset,
                         "runs": st.runs_processed})
    return header.encode() + b"\n" + pickle.dumps(st, protocol=pickle.HIGHEST_PROTOCOL)


def test_checkpoints_are_data_and_old_pickled_ones_still_load() -> None:
    """A detector's checkpoint is JSON (schema 2, service/statecodec.py), and a worker
    given the state continues with the same alarms; a schema-1 pickle still loads."""
    runs = recorded_runs()
    whole = Engine(CONFIG.detectors)
    expected = [e.to_dict() for r in runs for e in whole.process(r)]
    first = Engine(CONFIG.detectors)
    got = [e.to_dict() for r in runs[:len(runs) // 2] for e in first.process(r)]
    st = PartitionState(0, next_offset=len(runs) // 2)
    st.streams, st.latest_frozen = first.partition_state()
    data = encode_state(st)
    head, _, body = data.partition(b"\n")
    assert json.loads(head)["v"] == 2 and body[:1] == b"["
    json.loads(body)  # JSON, not a pickle
    for blob in (data, legacy_pickled_state(st)):
        back = decode_state(blob)
        eng = Engine(CONFIG.detectors)
        eng.load_streams(back.streams, back.latest_frozen, back.dropped)
        assert got + [e.to_dict() for r in runs[len(runs) // 2:]
                      for e in eng.process(r)] == expected


def test_command_records_round_trip() -> None:
    from assaywatch.monitor.scaleout.records import StreamCommand, encode_command

    key = StreamKey("a", "1", "s")
    for action in ("rebaseline", "delete"):
        cmd = StreamCommand(action, key, "id-1")
        assert decode_record(encode_command(cmd)) == cmd
    with pytest.raises(ValueError):
        encode_command(StreamCommand("wipe", key, "x"))
    for bad in ({"v": 1, "t": "rebaseline", "agent": "a", "version": "1", "scenario": 3,
                 "id": "x"},
                {"v": 1, "t": "delete", "agent": "a"},
                {"v": 1, "t": "wipe", "agent": "a", "version": "1", "scenario": "s",
                 "id": "x"}):
        with pytest.raises(RecordError):
            decode_record(json.dumps(bad).encode())


def test_a_run_with_an_infinite_cost_still_makes_a_record() -> None:
    """A cost of "Infinity" (string or double) or one that sums past the largest float is
    no cost: the run has none, and its record encodes (JSON has no inf; the assembler
    publishing it used to raise on every try)."""
    from assaywatch.monitor.pipeline.assemble import assemble_all
    from assaywatch.monitor.receivers.spans import SpanRecord

    tid = "ab" * 16
    root = SpanRecord(tid, "01" * 8, "", "invoke_agent a", 1_000, 9_000, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"})
    costs: list[dict[str, object]] = [
        {"gen_ai.usage.cost": "Infinity"}, {"llm.cost.total": float("inf")},
        {"llm.cost.total": float("-inf")},
        {"langfuse.observation.cost_details": '{"input": 1e308, "output": 1e308}'}]
    chats = [SpanRecord(tid, f"{i + 2:016x}", "01" * 8, "chat m", 2_000 + i, 3_000 + i,
                        attributes={"gen_ai.operation.name": "chat",
                                    "gen_ai.request.model": "m", **extra})
             for i, extra in enumerate(costs)]
    (run,) = assemble_all([root, *chats])
    assert len(run.steps) == 4 and [s.cost_usd for s in run.steps] == [None] * 4
    assert decode_run(encode_run(run)) == run
