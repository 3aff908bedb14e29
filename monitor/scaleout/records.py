"""What travels between the stages: run records, alarm records and detector checkpoints.

**Run record** (topic ``assaywatch.runs``): one assembled :class:`Run` as compact JSON,
``{"v": 1, ...}``, with every field the engine reads (outcome, steps with their action,
tool, tokens, latency, cost, errors, depth, models, times, evaluation score, the bounded
content-free run attributes). A Run holds no content (``analyzers/model.py``), so neither
does the record. ``decode_run(encode_run(run)) == run`` exactly (floats travel as their
shortest ``repr``), which is what makes the detectors over Kafka equal to a replay.

The record **key** is :func:`partition_key`: agent and scenario, *not* the version. The
engine gives a new version of an agent its previous version's frozen baseline (per agent and
scenario), so every version of an agent's scenario must be seen by one detector, in order.
The record's identity is the run id (``<trace id>:<root span id>``, :attr:`Run.run_id`):
deterministic, so a run re-published after an assembler crash is recognised and dropped.

**Alarm record** (topic ``assaywatch.alarms``): ``AlarmEvent.to_dict()`` plus ``id`` and
``episode``. ``episode`` counts the onsets of (stream, detector), kept in the checkpointed
state, so a worker that re-processes runs after a crash recomputes the same episode and the
same ``id``; consumers drop ids they have seen.

**Checkpoint** (compacted topic ``assaywatch.detector-state``, key ``<runs topic>:<partition>``,
written to the state topic's partition of the same number): a header line of JSON (schema,
partition, ``next_offset``) and the pickled :class:`PartitionState`. Pickle, like the single
monitor's SQLite checkpoint (``service/state.py``): the detectors are our own classes over
numpy arrays, written and read only by the detector workers; the topic must be writable only
by them (Kafka ACLs). It is read by the allow-listed unpickler (``service/safe_pickle.py``):
a record naming anything but the state's own classes, containers and arrays is refused, not
run.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from assaywatch.analyzers.baseline import Baseline
from assaywatch.analyzers.model import Action, Outcome, Run, Step, StreamKey
from assaywatch.monitor.engine.streams import AlarmEvent, StreamState
from assaywatch.monitor.service import safe_pickle

RUN_SCHEMA = 1
STATE_SCHEMA = 1


class RecordError(ValueError):
    """A record that is not a run record of a schema this version reads."""


# ---------------------------------------------------------------------------- runs

def partition_key(key: StreamKey) -> bytes:
    """Kafka record key of a run: agent and scenario (every version of them together)."""
    return f"{key.agent}\x1f{key.scenario}".encode()


def _step(s: Step) -> list[Any]:
    return [s.action.value, s.tool, s.output_length, int(s.error), s.input_tokens,
            s.output_tokens, s.latency_s, s.cost_usd, s.depth, s.start_ns, s.span_id,
            s.parent_span_id, s.name, s.model]


def encode_run(run: Run) -> bytes:
    """The run record of ``run`` (compact JSON, schema :data:`RUN_SCHEMA`)."""
    doc = {
        "v": RUN_SCHEMA,
        "trace": run.trace_id, "root": run.root_span_id,
        "agent": run.key.agent, "version": run.key.version, "scenario": run.key.scenario,
        "outcome": run.outcome.value, "out_len": run.output_length,
        "models": list(run.models), "start": run.start_ns, "end": run.end_ns,
        "err": int(run.error), "score": run.evaluation_score,
        "attrs": run.attributes, "steps": [_step(s) for s in run.steps],
        # the evaluators' scores and labels on the trace (optional keys: records written
        # before they were carried read as none)
        **({"scores": run.scores} if run.scores else {}),
        **({"labels": run.labels} if run.labels else {}),
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False).encode()


def decode_run(data: bytes) -> Run:
    """The :class:`Run` of a run record; :class:`RecordError` when it is not one."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("v") != RUN_SCHEMA:
            v = doc.get("v") if isinstance(doc, dict) else None
            raise RecordError(f"run record schema {v!r}; this version reads {RUN_SCHEMA}")
        steps = [Step(action=Action(a), tool=tool, output_length=ol, error=bool(err),
                      input_tokens=it, output_tokens=ot, latency_s=lat, cost_usd=cost,
                      depth=depth, start_ns=start, span_id=sid, parent_span_id=pid,
                      name=name, model=model)
                 for (a, tool, ol, err, it, ot, lat, cost, depth, start, sid, pid, name,
                      model) in doc["steps"]]
        return Run(trace_id=doc["trace"], root_span_id=doc["root"],
                   key=StreamKey(doc["agent"], doc["version"], doc["scenario"]),
                   steps=steps, output_length=doc["out_len"], outcome=Outcome(doc["outcome"]),
                   models=tuple(doc["models"]), start_ns=doc["start"], end_ns=doc["end"],
                   error=bool(doc["err"]), evaluation_score=doc["score"],
                   attributes=dict(doc["attrs"]),
                   scores={str(k): float(v) for k, v in dict(doc.get("scores", {})).items()},
                   labels={str(k): str(v) for k, v in dict(doc.get("labels", {})).items()})
    except RecordError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"not a run record: {type(exc).__name__}: {exc}") from None


# -------------------------------------------------------------------------- alarms

def alarm_id(key: StreamKey, detector: str, episode: int) -> str:
    """Deterministic id of an alarm episode: the same after any re-processing."""
    raw = f"{key.agent}\x1f{key.version}\x1f{key.scenario}\x1f{detector}\x1f{episode}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def alarm_record(event: AlarmEvent, episode: int) -> dict[str, Any]:
    return {**event.to_dict(), "episode": episode,
            "id": alarm_id(event.key, event.detector, episode)}


# ---------------------------------------------------------------------- checkpoints

@dataclass
class PartitionState:
    """Everything a detector worker keeps for one partition of the runs topic.

    ``streams``, ``latest_frozen`` and ``dropped`` are the engine's own state for the
    streams of this partition (the triple the single monitor checkpoints). The rest is the
    scale-out's bookkeeping: the next input offset, the recent run ids (duplicates from a
    re-publishing assembler are dropped), the alarm episodes per (stream, detector) and a
    hash chain of each stream's run ids (order evidence: equal chains = same runs, same
    order).
    """

    partition: int
    next_offset: int = 0
    streams: dict[StreamKey, StreamState] = field(default_factory=dict)
    latest_frozen: dict[tuple[str, str], Baseline] = field(default_factory=dict)
    dropped: Counter[str] = field(default_factory=Counter)
    recent_run_ids: OrderedDict[str, None] = field(default_factory=OrderedDict)
    episodes: Counter[tuple[StreamKey, str]] = field(default_factory=Counter)
    chains: dict[StreamKey, tuple[int, str]] = field(default_factory=dict)
    runs_processed: int = 0
    duplicates: int = 0


def chain_step(prev: tuple[int, str] | None, run_id: str) -> tuple[int, str]:
    """Extend a stream's run-id hash chain by one run: (count, sha256 hex)."""
    n, digest = prev or (0, "")
    return n + 1, hashlib.sha256(f"{digest}\n{run_id}".encode()).hexdigest()


def encode_state(state: PartitionState) -> bytes:
    header = json.dumps({"v": STATE_SCHEMA, "partition": state.partition,
                         "next_offset": state.next_offset, "runs": state.runs_processed})
    return header.encode() + b"\n" + pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def decode_state(data: bytes) -> PartitionState:
    """A checkpoint back; :class:`RecordError` for another schema or unreadable bytes."""
    head, sep, body = data.partition(b"\n")
    try:
        meta = json.loads(head)
    except ValueError:
        raise RecordError("not a detector checkpoint (no JSON header)") from None
    if not sep or not isinstance(meta, dict) or meta.get("v") != STATE_SCHEMA:
        v = meta.get("v") if isinstance(meta, dict) else None
        raise RecordError(f"checkpoint schema {v!r}; this version reads {STATE_SCHEMA}")
    try:
        state = safe_pickle.loads(body)
    except Exception as exc:
        raise RecordError(f"checkpoint unreadable ({type(exc).__name__})") from None
    if not isinstance(state, PartitionState):
        raise RecordError("checkpoint holds no PartitionState")
    return state


def state_key(runs_topic: str, partition: int) -> bytes:
    return f"{runs_topic}:{partition}".encode()
