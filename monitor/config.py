"""The monitor's configuration: one YAML file plus the DESIGN.md flags.

Every option is a dataclass field whose ``metadata["doc"]`` is its documentation; the
configuration reference in monitor/README.md is generated from these (``iter_options``).
Precedence: command-line flag > environment variable > config file > default. A bad
file fails at start with a message naming the file, the key and the valid choices.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_OTLP_GRPC = "127.0.0.1:4317"
DEFAULT_OTLP_HTTP = "127.0.0.1:4318"
DEFAULT_METRICS = "127.0.0.1:9464"

#: Environment variables read by ``assaywatch monitor`` (flag > env > file > default).
ENV_VARS = {
    "ASSAYWATCH_CONFIG": "path of the YAML config file (same as --config)",
    "ASSAYWATCH_STATE_DIR": "state directory (same as --state-dir)",
    "ASSAYWATCH_OTLP_GRPC": "OTLP/gRPC listen address HOST:PORT (same as --otlp-grpc)",
    "ASSAYWATCH_OTLP_HTTP": "OTLP/HTTP listen address HOST:PORT (same as --otlp-http)",
    "ASSAYWATCH_METRICS": "metrics/status listen address HOST:PORT (same as --metrics)",
    "ASSAYWATCH_API_TOKEN": "bearer token of the mutating API (POST /api/rebaseline, "
                            "/api/streams/delete); default: the state dir's api-token file",
    "ASSAYWATCH_ALLOWED_HOSTS": "comma-separated Host names the metrics port answers besides "
                                "loopback names and its bound address",
}


#: Detectors that may hold a share of a stream's false-alarm budget.
ALARMING = ("cusum_pass_rate", "cusum_fingerprint", "hotelling", "evaluation")


class ConfigError(ValueError):
    """A configuration mistake, with where it is and what to do."""


def _opt(default: Any, doc: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": doc}, **kw)
    return field(default=default, metadata={"doc": doc}, **kw)


@dataclass
class ListenConfig:
    otlp_grpc: str = _opt(DEFAULT_OTLP_GRPC, "OTLP/gRPC receiver address; empty disables it.")
    otlp_http: str = _opt(DEFAULT_OTLP_HTTP, "OTLP/HTTP receiver address (POST /v1/traces); "
                          "empty disables it.")
    metrics: str = _opt(DEFAULT_METRICS, "Prometheus /metrics, /healthz, /readyz and the "
                        "status page at /.")


@dataclass
class IngestConfig:
    max_request_bytes: int = _opt(8 * 1024 * 1024, "Largest OTLP request body accepted "
                                  "(413 / RESOURCE_EXHAUSTED above).")
    max_decompressed_bytes: int = _opt(64 * 1024 * 1024, "Largest decompressed OTLP/HTTP "
                                       "body (gzip bombs answer 413).")
    queue_max_spans: int = _opt(200_000, "Spans waiting for the pipeline; above it receivers "
                                "answer 429/503 or UNAVAILABLE with a retry hint.")
    queue_max_bytes: int = _opt(
        64 * 1024 * 1024, "Estimated memory of the records waiting for the pipeline (a fixed "
        "part per span plus its name, attribute keys and values, as decoded: message "
        "content the pipeline reads counts in full). Above it receivers answer 503 or "
        "UNAVAILABLE with a retry hint (counted as rejected, reason pipeline_full_bytes); a "
        "single request larger than the whole bound is taken alone when the queue is empty. "
        "64 MiB is a few seconds of pipeline work (~50,000 spans without content, ~20,000 "
        "carrying 2 KB outputs) and keeps the queue's share of a 1 GiB limit fixed whatever "
        "the spans carry.")

    def __post_init__(self) -> None:
        if not isinstance(self.queue_max_bytes, int) or isinstance(self.queue_max_bytes, bool) \
                or self.queue_max_bytes < 1 << 20:
            raise ConfigError("ingest: queue_max_bytes must be at least 1048576 (1 MiB), "
                              f"got {self.queue_max_bytes!r}")


@dataclass
class AssemblerConfig:
    grace_seconds: float = _opt(5.0, "A run closes this long after its root ended and no "
                                "new span of its trace arrived.")
    max_age_seconds: float = _opt(300.0, "A trace is closed at this age even if its root "
                                  "never ends.")
    max_pending_traces: int = _opt(10_000, "Open traces kept; above it a trace is evicted, "
                                   "fairly per sender as for max_pending_bytes (counted as "
                                   "dropped, reason evicted_trace or sender_quota).")
    max_spans_per_trace: int = _opt(5_000, "Spans kept per trace; more are counted as "
                                    "dropped (reason trace_too_large).")
    max_pending_bytes: int = _opt(
        128 * 1024 * 1024, "Estimated memory of the open traces' spans (a fixed part per "
        "trace and span plus the sizes of the attribute values kept; message content is "
        "not kept). Above it, and above max_pending_traces, a trace is evicted fairly per "
        "sender (resource service.name): a sender above its equal share loses its own "
        "oldest trace first (counted as dropped, reason sender_quota; pending_bytes or "
        "evicted_trace with a single sender). See monitor/README.md \"Memory and "
        "overload\".")

    def __post_init__(self) -> None:
        if not isinstance(self.max_pending_bytes, int) or self.max_pending_bytes < 1 << 20:
            raise ConfigError("assembler: max_pending_bytes must be at least 1048576 (1 MiB), "
                              f"got {self.max_pending_bytes!r}")


@dataclass
class StreamsConfig:
    key_attributes: list[str] = _opt(
        [], "Extra attributes that split a stream (agent, version, scenario) further, so "
        "each value gets its own baseline: e.g. gen_ai.request.model (per model; falls back "
        "to the run's first model call), a tenant or prompt-version attribute. Read on the "
        "run's root span, else its resource; their values join the scenario label as "
        "`refund [gen_ai.request.model=gpt-4o-mini]`. Bounded by limits.max_streams like "
        "any stream; values cut to 64 characters.")

    def __post_init__(self) -> None:
        bad = [k for k in self.key_attributes if not isinstance(k, str) or not k]
        if bad or len(self.key_attributes) > 8:
            raise ConfigError("streams: key_attributes must be at most 8 attribute names, "
                              f"got {self.key_attributes!r}")


@dataclass
class EvaluationsConfig:
    join_window_seconds: float = _opt(
        600.0, "How long after its run closed an evaluation (OTLP log event "
        "gen_ai.evaluation.result) still joins it; also how long an evaluation that arrives "
        "before its trace waits for it, and how long a run not judged on the trace waits "
        "for a late pass/fail verdict once its stream has received one. Later evaluations "
        "are counted (assaywatch_evaluation_joins_total, outcome unmatched).")
    max_closed_runs: int = _opt(
        100_000, "Closed traces remembered for late evaluations (a digest of a few hundred "
        "bytes each: run ids, stream, span ids); above it the oldest is forgotten (counted, "
        "outcome digest_evicted).")
    max_waiting: int = _opt(
        10_000, "Evaluations kept while waiting for a trace not seen yet; more are counted "
        "(outcome waiting_limit).")
    min_drop: float = _opt(
        0.1, "Drop of an evaluator's mean score, as a fraction of its scale (0.1 = 0.1 on "
        "a 0-1 score, 0.4 on a 1-5 rubric), its detector is tuned for; for an evaluator "
        "that only labels runs, the probability one label gains.")

    def __post_init__(self) -> None:
        if not self.join_window_seconds >= 0 or self.max_closed_runs < 1 or \
                self.max_waiting < 0:
            raise ConfigError("evaluations: join_window_seconds must be >= 0, "
                              "max_closed_runs >= 1 and max_waiting >= 0")
        if not 0 < self.min_drop < 1:
            raise ConfigError("evaluations: min_drop must be in (0, 1) (a fraction of the "
                              f"score's scale), got {self.min_drop!r}")


@dataclass
class DetectorConfig:
    learn_runs: int = _opt(200, "Runs a stream without a baseline learns from before its "
                           "baseline is frozen and the detectors start. From about 500 on, "
                           "no tenth of the streams carries more than a quarter of the "
                           "false alarms (README, How it decides).")
    arl0: float = _opt(10_000.0, "Target in-control average run length per stream: runs "
                       "between false alarms, for the union of the stream's detectors.")
    arl0_confidence: float = _opt(0.9, "Probability that the true ARL0 meets the target given "
                                  "that the baseline is an estimate from finite data.")
    delta: float = _opt(0.1, "Smallest pass-rate drop worth an alarm (SPRT and CUSUM).")
    alpha: float = _opt(0.01, "SPRT Type I error per decision cycle, and the alpha of the "
                        "pass-rate and fingerprint verdicts.")
    beta: float = _opt(0.1, "SPRT Type II error (1 - power at a drop of delta).")
    sprt_max_runs: int = _opt(1_000, "SPRT truncation: a cycle longer than this ends "
                              "Inconclusive and restarts.")
    fingerprint_shift: float = _opt(0.5, "Shift of the fingerprint, in baseline standard "
                                    "deviations along one direction (Mahalanobis units), the "
                                    "fingerprint CUSUM is tuned for (reference k = shift / 2).")
    mewma_min_baseline: int = _opt(1_000, "Unused since the fingerprint is watched by the "
                                   "multichart CUSUM with bootstrap thresholds (kept so older "
                                   "config files still load).")
    alarm_shares: dict[str, float] = _opt(
        {"cusum_pass_rate": 0.5, "cusum_fingerprint": 0.5, "evaluation": 0.5},
        "Shares of the false-alarm budget `arl0` given to the detectors that raise alarms "
        "(cusum_pass_rate, cusum_fingerprint, hotelling, evaluation: the graded-score "
        "detectors, split equally over the evaluators in the baseline); the others report "
        "verdicts and gauges only. The SPRT never alarms: its verdict is a gauge. "
        "Normalised to sum to 1 over the configured detectors the baseline can run (no "
        "evaluation share without evaluators, no pass-rate share without outcomes).")
    calibration_runs: int = _opt(2_000, "Baseline runs kept (reservoir sample) while a "
                                 "baseline is learned, for the bootstrap calibration of the "
                                 "thresholds: each its fingerprint and its calls' latency "
                                 "sums (about 0.6 KB a run with five tools); file baselines "
                                 "carry none and are calibrated on Gaussian draws with their "
                                 "mean and covariance (no latency chart).")
    bootstrap_reps: int = _opt(40, "Bootstrap baselines drawn per calibration (guaranteed "
                               "conditional performance at arl0_confidence); the "
                               "fingerprint's, for a baseline of fewer than 2,000 runs, "
                               "this times 2,000 / its runs, at most 5x (its thresholds' "
                               "quantile over few draws covers less than asked, and more "
                               "so the smaller the baseline).")
    hotelling_window: int = _opt(200, "Recent runs compared with the baseline by Hotelling "
                                 "T^2 and the pass-rate verdict.")
    hotelling_every: int = _opt(25, "Runs between two windowed Hotelling tests.")
    alarm_hold_runs: int = _opt(200, "An alarm stays active this many runs after it last "
                                "fired (SPRT: until the next Pass decision).")
    detectors: list[str] = _opt(["sprt", "cusum_pass_rate", "cusum_fingerprint", "hotelling",
                                 "evaluation"], "Detectors run per stream.")

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.alarm_shares.items()
               if k not in ALARMING
               or not isinstance(v, (int, float)) or not 0 <= v < float("inf")}
        if bad:
            raise ConfigError(f"detectors: alarm_shares {bad} invalid: keys among "
                              f"{', '.join(ALARMING)} (the SPRT never alarms), values >= 0")
        if self.calibration_runs < 2 or self.bootstrap_reps < 5:
            raise ConfigError("detectors: calibration_runs must be >= 2 and bootstrap_reps "
                              ">= 5")


@dataclass
class LimitsConfig:
    max_streams: int = _opt(1_000, "Streams (agent, version, scenario) tracked. At the "
                            "limit, a new stream takes the place of the least recently "
                            "active one if that has had no run for replace_idle_seconds; "
                            "else its runs are dropped (reason stream_limit).")
    stream_idle_seconds: float = _opt(
        604_800.0, "A stream without a run for this long (wall clock; `assaywatch replay`: "
        "by the runs' end times) is "
        "forgotten: detectors, counts and series (counted in "
        "assaywatch_streams_removed_total{reason=\"idle\"}); a later run starts it again "
        "from its last frozen baseline, as a new version would. 0 keeps streams forever. "
        "Default 7 days.")
    replace_idle_seconds: float = _opt(
        3_600.0, "At max_streams, how long a stream must have been idle before a new stream "
        "may take its place (reason replaced); negative never replaces. Active streams are "
        "never displaced, so a flood of junk names cannot evict a working agent.")

    def __post_init__(self) -> None:
        if not isinstance(self.max_streams, int) or self.max_streams < 1 \
                or not self.stream_idle_seconds >= 0:
            raise ConfigError("limits: max_streams must be an integer >= 1 and "
                              "stream_idle_seconds >= 0 (0 never expires streams), got "
                              f"{self.max_streams!r}, {self.stream_idle_seconds!r}")


@dataclass
class MonitorConfig:
    listen: ListenConfig = field(default_factory=ListenConfig, metadata={"doc": "Addresses."})
    ingest: IngestConfig = field(default_factory=IngestConfig, metadata={"doc": "Receivers."})
    assembler: AssemblerConfig = field(default_factory=AssemblerConfig,
                                       metadata={"doc": "Run assembly."})
    detectors: DetectorConfig = field(default_factory=DetectorConfig,
                                      metadata={"doc": "Statistics."})
    limits: LimitsConfig = field(default_factory=LimitsConfig, metadata={"doc": "Bounds."})
    evaluations: EvaluationsConfig = field(default_factory=EvaluationsConfig,
                                           metadata={"doc": "Evaluation scores."})
    streams: StreamsConfig = field(default_factory=StreamsConfig,
                                   metadata={"doc": "Stream keys."})
    state_dir: str = _opt("", "Directory for the SQLite checkpoint and the alarm event log; "
                          "empty keeps state in memory only.")
    baselines: list[str] = _opt([], "Baseline JSON files (from `assaywatch baseline build`) "
                                "loaded at start.")
    checkpoint_seconds: float = _opt(10.0, "Seconds between two state checkpoints.")
    wal_fsync_seconds: float = _opt(1.0, "Seconds between two fsyncs of the write-ahead log "
                                    "of acknowledged spans (power-loss window); 0 fsyncs "
                                    "before every acknowledgement, negative never.")
    wal_segment_bytes: int = _opt(64 * 1024 * 1024, "Size at which a write-ahead log "
                                  "segment is closed and a new one started.")
    evaluation_threshold: float = _opt(0.5, "An evaluation score at or above this is a pass.")
    contracts: dict[str, Any] = _opt({}, "Contract rules deciding a run's outcome when no "
                                     "evaluation is recorded (see Outcome).")
    kafka: dict[str, Any] = _opt({}, "Scale-out settings read by `assaywatch kafka assemble` "
                                 "and `kafka detect` (deploy/README.md); the monitor and "
                                 "replay ignore them, so one file serves all.")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "config") -> MonitorConfig:
        return _build(cls, data, source)  # type: ignore[return-value]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MonitorConfig:
        import yaml

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"{p}: the top level must be a mapping of options")
        return cls.from_mapping(data, str(p))


def _build(cls: type, data: Mapping[str, Any], where: str) -> object:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown option(s) {', '.join(unknown)}; "
                          f"valid: {', '.join(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        default = getattr(cls(), name)
        if dataclasses.is_dataclass(default):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: {name} must be a mapping")
            kwargs[name] = _build(type(default), value, f"{where}: {name}")
            continue
        kwargs[name] = _coerce(value, default, f"{where}: {name}")
    obj = cls(**kwargs)
    _validate(obj, where)
    return obj


def _coerce(value: Any, default: Any, where: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, int) and not isinstance(value, bool) and isinstance(value, int):
        return value
    if isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(
            value, bool):
        return float(value)
    if isinstance(default, str) and isinstance(value, str):
        return value
    if isinstance(default, list) and isinstance(value, list):
        return list(value)
    if isinstance(default, dict) and isinstance(value, Mapping):
        return dict(value)
    raise ConfigError(f"{where} must be a {type(default).__name__}, got {value!r}")


_KNOWN_DETECTORS = ("sprt", "cusum_pass_rate", "cusum_fingerprint", "hotelling", "evaluation")


def _validate(obj: object, where: str) -> None:
    if isinstance(obj, DetectorConfig):
        bad = [d for d in obj.detectors if d not in _KNOWN_DETECTORS]
        if bad:
            raise ConfigError(f"{where}: unknown detector(s) {bad}; valid: "
                              f"{', '.join(_KNOWN_DETECTORS)}")
        for name in ("alpha", "beta", "delta", "arl0_confidence"):
            v = getattr(obj, name)
            if not 0 < v < 1:
                raise ConfigError(f"{where}: {name} must lie strictly between 0 and 1, got {v}")
        if obj.arl0 < 10:
            raise ConfigError(f"{where}: arl0 must be at least 10 runs, got {obj.arl0}")
        for name in ("learn_runs", "hotelling_window", "hotelling_every", "sprt_max_runs"):
            if getattr(obj, name) < 2:
                raise ConfigError(f"{where}: {name} must be at least 2")
    if isinstance(obj, ListenConfig):
        for name in ("otlp_grpc", "otlp_http", "metrics"):
            v = getattr(obj, name)
            if v:
                parse_hostport(v, f"{where}: {name}")


def parse_hostport(value: str, where: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) to (host, port); ValueError with a hint."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where}: expected HOST:PORT (for example 127.0.0.1:4317), "
                          f"got {value!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def iter_options(cls: type = MonitorConfig, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """Yield (dotted key, default, doc) for every option, for the generated reference."""
    inst = cls()
    for f in dataclasses.fields(cls):
        value = getattr(inst, f.name)
        if dataclasses.is_dataclass(value):
            yield from iter_options(type(value), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value, f.metadata.get("doc", "")
