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

**Evaluation record** (same topic, same key as its run's stream): a
:class:`LateEvaluation`, an evaluation that reached the assembler after its run's record was
published, as compact JSON ``{"v": 1, "t": "evaluation", ...}``: run id, stream key, the
run's start, the evaluation's name, label, score and pass flag, and the scores and labels
by evaluator. Never an explanation or any other content (an :class:`Evaluation` holds none).
A record without ``"t"`` is a run record (records written before evaluations travelled);
:func:`decode_record` tells them apart. Its identity is (run id, evaluator names):
:func:`evaluation_id`.

**Command record** (same topic, the stream's key): ``{"v": 1, "t": "rebaseline" | "delete",
"agent", "version", "scenario", "id"}``, a :class:`StreamCommand` written by a detector
worker's ``POST /api/rebaseline`` or ``/api/streams/delete``: the worker that owns the
stream applies it in order with the stream's runs, so a restore or a replay of the topic
sees it at the same place.

**Alarm record** (topic ``assaywatch.alarms``): ``AlarmEvent.to_dict()`` plus ``id`` and
``episode``. ``episode`` counts the onsets of (stream, detector), kept in the checkpointed
state, so a worker that re-processes runs after a crash recomputes the same episode and the
same ``id``; consumers drop ids they have seen.

**Checkpoint** (compacted topic ``assaywatch.detector-state``, key ``<runs topic>:<partition>``,
written to the state topic's partition of the same number): a header line of JSON (schema,
partition, ``next_offset``) and the :class:`PartitionState` as data
(``service/statecodec.py``, as the single monitor's checkpoint): JSON naming the allowed
state classes and their attributes; reading it calls nothing the data names. There is no
MAC on this topic: it must be writable only by the detector workers (Kafka ACLs), since a
writer could replace a state with another valid one. A checkpoint of the previous schema
(1, a pickle) is read once, to upgrade, by the allow-listed unpickler
(``service/safe_pickle.py``); the next checkpoint is written as data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from assaywatch.analyzers.baseline import Baseline
from assaywatch.analyzers.model import UNNAMED_EVALUATOR, Action, Outcome, Run, Step, StreamKey
from assaywatch.monitor.engine.streams import AlarmEvent, StreamState
from assaywatch.monitor.pipeline.join import LateEvaluation
from assaywatch.monitor.pipeline.outcome import Evaluation
from assaywatch.monitor.service import safe_pickle, statecodec

RUN_SCHEMA = 1
STATE_SCHEMA = 2
#: The checkpoints of earlier versions (a pickled PartitionState): read to upgrade.
PICKLED_STATE_SCHEMA = 1
#: The ``"t"`` of an evaluation record (a run record has none).
EVALUATION_TYPE = "evaluation"
#: The ``"t"`` of the command records.
COMMAND_TYPES = ("rebaseline", "delete")


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
        return _run_of(doc)
    except RecordError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"not a run record: {type(exc).__name__}: {exc}") from None


def _run_of(doc: dict[str, Any]) -> Run:
    if "t" in doc:
        raise RecordError(f"not a run record: a record of type {doc['t']!r}")
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


# --------------------------------------------------------------------- evaluations

def _number(x: float | None) -> float | str | None:
    """A score as JSON: infinities (which ``as_float`` lets through) as their repr."""
    return x if x is None or math.isfinite(x) else repr(x)


def encode_evaluation(late: LateEvaluation) -> bytes:
    """The evaluation record of ``late`` (compact JSON, ``"t": "evaluation"``)."""
    ev = late.evaluation
    doc = {
        "v": RUN_SCHEMA, "t": EVALUATION_TYPE, "run": late.run_id,
        "agent": late.key.agent, "version": late.key.version, "scenario": late.key.scenario,
        "start": late.start_ns,
        "ev": [ev.name, ev.label, _number(ev.score), ev.passed],
        **({"scores": late.scores} if late.scores else {}),
        **({"labels": late.labels} if late.labels else {}),
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False).encode()


def _optional(x: Any, kind: type) -> Any:
    if x is not None and type(x) is not kind:  # JSON gives exactly str / bool
        raise TypeError(f"{x!r} is not a {kind.__name__}")
    return x


def _evaluation_of(doc: dict[str, Any]) -> LateEvaluation:
    name, label, score, passed = doc["ev"]
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, int | float | str):
            raise TypeError(f"score {score!r} is not a number")
        score = float(score)
    start = doc["start"]
    if isinstance(start, bool) or not isinstance(start, int):
        raise TypeError(f"start {start!r} is not an integer")
    return LateEvaluation(
        run_id=str(doc["run"]),
        key=StreamKey(str(doc["agent"]), str(doc["version"]), str(doc["scenario"])),
        evaluation=Evaluation(name=_optional(name, str), label=_optional(label, str),
                              score=score, passed=_optional(passed, bool)),
        scores={str(k): float(v) for k, v in dict(doc.get("scores", {})).items()},
        start_ns=start,
        labels={str(k): str(v) for k, v in dict(doc.get("labels", {})).items()})


@dataclass(frozen=True)
class StreamCommand:
    """A re-baseline or a deletion of one stream, as an input of the runs topic."""

    action: str  # one of COMMAND_TYPES
    key: StreamKey
    id: str


def encode_command(cmd: StreamCommand) -> bytes:
    if cmd.action not in COMMAND_TYPES:
        raise ValueError(f"command {cmd.action!r}: one of {COMMAND_TYPES}")
    return json.dumps({"v": RUN_SCHEMA, "t": cmd.action, "agent": cmd.key.agent,
                       "version": cmd.key.version, "scenario": cmd.key.scenario,
                       "id": cmd.id}, separators=(",", ":"), ensure_ascii=False).encode()


def _command_of(doc: dict[str, Any]) -> StreamCommand:
    fields = [doc["agent"], doc["version"], doc["scenario"], doc["id"]]
    if not all(isinstance(f, str) for f in fields):
        raise TypeError("a command's stream and id are strings")
    return StreamCommand(doc["t"], StreamKey(*fields[:3]), fields[3])


def decode_record(data: bytes) -> Run | LateEvaluation | StreamCommand:
    """A run record's :class:`Run`, an evaluation record's :class:`LateEvaluation` or a
    command record's :class:`StreamCommand`; :class:`RecordError` for anything else."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("v") != RUN_SCHEMA:
            v = doc.get("v") if isinstance(doc, dict) else None
            raise RecordError(f"record schema {v!r}; this version reads {RUN_SCHEMA}")
        kind = doc.get("t")
        if kind is None:
            return _run_of(doc)
        if kind in COMMAND_TYPES:
            return _command_of(doc)
        if kind != EVALUATION_TYPE:
            raise RecordError(f"record type {kind!r}; this version reads run, "
                              f"{EVALUATION_TYPE!r} and command {COMMAND_TYPES} records")
        return _evaluation_of(doc)
    except RecordError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"not a run or evaluation record: {type(exc).__name__}: {exc}"
                          ) from None


def evaluation_id(run_id: str, names: Iterable[str]) -> str:
    """Identity of an evaluation of a run: the run id and its evaluators' names (sorted).
    The same for a re-published copy; a run record's evaluator ``name`` gives
    ``evaluation_id(run_id, [name])``."""
    return f"{run_id}\x1f{','.join(sorted(names))}"


def evaluator_names(late: LateEvaluation) -> list[str]:
    """The evaluators a late evaluation speaks for: those of its scores and labels, else
    its name (an evaluation with only a pass flag)."""
    names = [*late.scores, *late.labels]
    return names or [late.evaluation.name or UNNAMED_EVALUATOR]


# -------------------------------------------------------------------------- alarms

def alarm_id(key: StreamKey, detector: str, episode: int) -> str:
    """Deterministic id of an alarm episode: the same after any re-processing.
    ``detector`` is the alarm key (``evaluation:<evaluator>`` for an evaluator's)."""
    raw = f"{key.agent}\x1f{key.version}\x1f{key.scenario}\x1f{detector}\x1f{episode}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def alarm_record(event: AlarmEvent, episode: int) -> dict[str, Any]:
    return {**event.to_dict(), "episode": episode,
            "id": alarm_id(event.key, event.alarm_key, episode)}


# ---------------------------------------------------------------------- checkpoints

@dataclass
class PartitionState:
    """Everything a detector worker keeps for one partition of the runs topic.

    ``streams``, ``latest_frozen`` and ``dropped`` are the engine's own state for the
    streams of this partition (the triple the single monitor checkpoints). The rest is the
    scale-out's bookkeeping: the next input offset, the recent run ids (duplicates from a
    re-publishing assembler are dropped), the alarm episodes per (stream, alarm key), a
    hash chain of each stream's run ids (order evidence: equal chains = same runs, same
    order) and the recent evaluation ids (:func:`evaluation_id`; a re-published evaluation
    record is dropped).

    A field added later has a default; :func:`decode_state` gives it to a checkpoint written
    before it existed.
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
    recent_evaluations: OrderedDict[str, None] = field(default_factory=OrderedDict)
    #: records held by the reorder window (``reorder_seconds``), sorted: (time ns, 0 for a
    #: run / 1 for another record, run id, arrival number, the record's bytes); a run's
    #: time is its end, another record's the latest run end seen when it came
    pending: list[tuple[int, int, str, int, bytes]] = field(default_factory=list)
    #: the latest run end seen (ns), the arrival counter, and when (Unix s) the last
    #: record came (the window's wall-clock flush)
    max_end_ns: int = 0
    arrivals: int = 0
    last_arrival: float = 0.0


def chain_step(prev: tuple[int, str] | None, run_id: str) -> tuple[int, str]:
    """Extend a stream's run-id hash chain by one run: (count, sha256 hex)."""
    n, digest = prev or (0, "")
    return n + 1, hashlib.sha256(f"{digest}\n{run_id}".encode()).hexdigest()


def encode_state(state: PartitionState) -> bytes:
    header = json.dumps({"v": STATE_SCHEMA, "partition": state.partition,
                         "next_offset": state.next_offset, "runs": state.runs_processed})
    return header.encode() + b"\n" + statecodec.dumps(state)


def decode_state(data: bytes) -> PartitionState:
    """A checkpoint back; :class:`RecordError` for another schema or unreadable bytes."""
    head, sep, body = data.partition(b"\n")
    try:
        meta = json.loads(head)
    except ValueError:
        raise RecordError("not a detector checkpoint (no JSON header)") from None
    v = meta.get("v") if isinstance(meta, dict) else None
    if not sep or v not in (STATE_SCHEMA, PICKLED_STATE_SCHEMA):
        raise RecordError(f"checkpoint schema {v!r}; this version reads "
                          f"{PICKLED_STATE_SCHEMA} and {STATE_SCHEMA}")
    try:
        state = (statecodec.loads(body) if v == STATE_SCHEMA else safe_pickle.loads(body))
    except Exception as exc:
        raise RecordError(f"checkpoint unreadable ({type(exc).__name__})") from None
    if not isinstance(state, PartitionState):
        raise RecordError("checkpoint holds no PartitionState")
    for f in dataclasses.fields(PartitionState):  # fields newer than the checkpoint
        if f.name not in state.__dict__:
            setattr(state, f.name, f.default_factory() if f.default_factory is not
                    dataclasses.MISSING else f.default)
    return state


def state_key(runs_topic: str, partition: int) -> bytes:
    return f"{runs_topic}:{partition}".encode()
