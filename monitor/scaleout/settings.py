"""The scale-out's settings: the ``kafka:`` section of the monitor's YAML, or flags.

Every option has a flag of ``assaywatch kafka assemble|detect``; a flag wins over the file.
The rest of the file (``assembler``, ``detectors``, ``limits``, ``contracts``, ...) is the
single monitor's configuration, read by :class:`MonitorConfig` as it is, so a replay with
the same file gives the same alarms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from assaywatch.monitor.config import ConfigError, MonitorConfig


@dataclass
class KafkaSettings:
    """Topics, groups and the delivery knobs of both stages (the ``kafka:`` section)."""

    bootstrap: str = field(default="127.0.0.1:9092", metadata={
        "doc": "Kafka bootstrap servers, comma-separated."})
    spans_topic: str = field(default="assaywatch.spans", metadata={
        "doc": "Topic the Collector's kafka exporter writes (otlp_proto, keyed by trace id)."})
    logs_topic: str = field(default="assaywatch.logs", metadata={
        "doc": "Topic of the Collector's OTLP logs (otlp_proto, partition_logs_by_trace_id) "
               "carrying gen_ai.evaluation.result events; it must have the spans topic's "
               "partition count. '' or a missing topic: spans only."})
    runs_topic: str = field(default="assaywatch.runs", metadata={
        "doc": "Run records, keyed by agent and scenario."})
    state_topic: str = field(default="assaywatch.detector-state", metadata={
        "doc": "Compacted topic of detector checkpoints, one key per runs partition."})
    alarms_topic: str = field(default="assaywatch.alarms", metadata={
        "doc": "Alarm onsets with a deterministic id ('' disables)."})
    assemble_group: str = field(default="assaywatch-assemblers", metadata={
        "doc": "Consumer group of the assemblers (stage 1)."})
    detect_group: str = field(default="assaywatch-detectors", metadata={
        "doc": "Consumer group of the detector workers (stage 2)."})
    instance_id: str = field(default="", metadata={
        "doc": "Static group membership id (group.instance.id), stable across restarts "
               "(the pod name); empty: dynamic membership. Also names the transactional id."})
    partitions: int = field(default=12, metadata={
        "doc": "Partitions of topics this process creates when they are missing."})
    replication_factor: int = field(default=0, metadata={
        "doc": "Replication of created topics; 0: min(3, brokers)."})
    session_timeout_ms: int = field(default=10_000, metadata={
        "doc": "Consumer session timeout: how long a dead member keeps its partitions."})
    commit_seconds: float = field(default=1.0, metadata={
        "doc": "Assemblers: seconds between offset commits (after their runs are delivered)."})
    checkpoint_seconds: float = field(default=1.0, metadata={
        "doc": "Detectors: seconds between checkpoints of changed partitions."})
    checkpoint_runs: int = field(default=2_000, metadata={
        "doc": "Detectors: also checkpoint after this many runs."})
    transactions: str = field(default="auto", metadata={
        "doc": "Detectors: 'auto' (use Kafka transactions when the broker has them), "
               "'on' (require them), 'off'."})
    transaction_timeout_ms: int = field(default=15_000, metadata={
        "doc": "transaction.timeout.ms: how long a dead worker's open transaction blocks "
               "readers of the runs it wrote until the broker aborts it."})
    reorder_seconds: float = field(default=0.0, metadata={
        "doc": "Detectors: hold each record this many seconds of the runs' end times (or "
               "of wall time when no newer run comes) and process a partition's runs in "
               "(end time, run id) order, as replay does; 0: in arrival order. Size it above "
               "the lateness seen: an assembler crash's takeover (session_timeout_ms + "
               "assembler.grace_seconds) plus lag differences between spans partitions; "
               "alarms come that much later."})
    dedup_runs: int = field(default=20_000, metadata={
        "doc": "Recent run ids remembered per partition to drop re-published runs."})
    poll_seconds: float = field(default=0.05, metadata={
        "doc": "Longest wait of one consumer poll (also the assemblers' closing tick)."})
    connect_timeout_seconds: float = field(default=30.0, metadata={
        "doc": "Bounded wait for the broker at start; exit 3 after it."})
    client: dict[str, str] = field(default_factory=dict, metadata={
        "doc": "Extra librdkafka properties for every client (security.protocol, sasl.*)."})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "kafka") -> KafkaSettings:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ConfigError(f"{where}: unknown option(s) {', '.join(unknown)}; "
                              f"valid: {', '.join(fields)}")
        out = cls()
        for name, value in data.items():
            default = getattr(out, name)
            if isinstance(default, dict):
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{where}: {name} must be a mapping")
                value = {str(k): str(v) for k, v in value.items()}
            elif isinstance(default, bool) or not isinstance(value, type(default)):
                if isinstance(default, float) and isinstance(value, int):
                    value = float(value)
                else:
                    raise ConfigError(f"{where}: {name} must be {type(default).__name__}, "
                                      f"got {value!r}")
            setattr(out, name, value)
        out.validate(where)
        return out

    def validate(self, where: str = "kafka") -> None:
        if self.transactions not in ("auto", "on", "off"):
            raise ConfigError(f"{where}: transactions must be auto, on or off")
        for name in ("partitions", "checkpoint_runs", "dedup_runs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{where}: {name} must be >= 1")
        for name in ("commit_seconds", "checkpoint_seconds", "poll_seconds",
                     "connect_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{where}: {name} must be > 0")
        if not 0 <= self.reorder_seconds <= 3600:
            raise ConfigError(f"{where}: reorder_seconds must be between 0 and 3600")


def load_config(path: str | None) -> tuple[MonitorConfig, KafkaSettings]:
    """The monitor configuration and the ``kafka:`` section of one YAML file."""
    if not path:
        return MonitorConfig(), KafkaSettings()
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: the top level must be a mapping of options")
    data = dict(data)
    kafka = KafkaSettings.from_mapping(data.pop("kafka", None) or {}, f"{p}: kafka")
    return MonitorConfig.from_mapping(data, str(p)), kafka
