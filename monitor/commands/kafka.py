"""``assaywatch kafka assemble|detect``: the two stages of the scale-out over Kafka.

``assemble`` reads the spans topic the Collector's kafka exporter writes and publishes run
records; ``detect`` runs the per-stream detectors over the run records with checkpoints in
a compacted state topic. ``deploy/README.md`` ("Scale-out on Kafka") shows the topology;
``monitor/scaleout/`` has the delivery and ordering guarantees.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

#: flag -> KafkaSettings field, per subcommand
_COMMON = {"bootstrap": "bootstrap", "runs_topic": "runs_topic", "group": None,
           "instance_id": "instance_id", "partitions": "partitions",
           "session_timeout_ms": "session_timeout_ms", "poll_seconds": "poll_seconds",
           "connect_timeout": "connect_timeout_seconds"}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "kafka", help="scale out over Kafka: assemblers and detector workers",
        description=(
            "The two-stage scale-out: `assemble` turns the spans the Collector's kafka "
            "exporter writes into run records keyed by stream; `detect` runs the detectors "
            "per stream with checkpoints in a compacted topic. Flags override the `kafka:` "
            "section of --config; the rest of that file is the monitor's configuration."))
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True,
                               parser_class=type(p))

    def common(q: argparse.ArgumentParser, group_help: str) -> None:
        q.add_argument("--bootstrap", metavar="HOSTS",
                       default=os.environ.get("ASSAYWATCH_KAFKA_BOOTSTRAP"),
                       help="Kafka bootstrap servers (env ASSAYWATCH_KAFKA_BOOTSTRAP; "
                            "default 127.0.0.1:9092)")
        q.add_argument("--runs-topic", metavar="TOPIC", help="run records topic "
                       "(default assaywatch.runs)")
        q.add_argument("--group", metavar="ID", help=group_help)
        q.add_argument("--instance-id", metavar="ID",
                       default=os.environ.get("ASSAYWATCH_INSTANCE_ID"),
                       help="static group membership id, stable across restarts, e.g. the "
                            "pod name (env ASSAYWATCH_INSTANCE_ID)")
        q.add_argument("--config", metavar="FILE", default=os.environ.get("ASSAYWATCH_CONFIG"),
                       help="monitor config YAML with an optional kafka: section "
                            "(env ASSAYWATCH_CONFIG)")
        q.add_argument("--metrics", metavar="HOST:PORT", default=None,
                       help="serve /metrics, /healthz, /readyz here (default: none)")
        q.add_argument("--partitions", type=int, metavar="N",
                       help="partitions of topics created when missing (default 12)")
        q.add_argument("--session-timeout-ms", type=int, metavar="MS",
                       help="consumer session timeout (default 10000)")
        q.add_argument("--poll-seconds", type=float, metavar="S", help=argparse.SUPPRESS)
        q.add_argument("--connect-timeout", type=float, metavar="S",
                       help="wait this long for the broker, then exit 3 (default 30)")
        q.add_argument("--log-level", default="INFO",
                       choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log verbosity")

    a = actions.add_parser("assemble", help="spans topic -> run records",
                           description="Consume the spans topic (otlp_proto, keyed by trace "
                           "id), assemble runs with the monitor's pipeline and publish run "
                           "records keyed by stream (idempotent producer, acks=all; offsets "
                           "committed only once the runs are acknowledged and no open trace "
                           "needs them).")
    common(a, "consumer group (default assaywatch-assemblers)")
    a.add_argument("--spans-topic", metavar="TOPIC",
                   help="topic the Collector writes (default assaywatch.spans)")
    a.add_argument("--logs-topic", metavar="TOPIC",
                   help="topic of the Collector's OTLP logs (evaluation events), with the "
                        "spans topic's partition count (default assaywatch.logs, created "
                        "with it when missing; another count: exit 3; '': spans only)")
    a.add_argument("--commit-seconds", type=float, metavar="S",
                   help="seconds between offset commits (default 1)")
    a.set_defaults(func=run_assemble)

    d = actions.add_parser("detect", help="run records -> detectors, alarms, metrics",
                           description="Consume run records (cooperative-sticky, static "
                           "membership, read_committed), run the detectors per stream, "
                           "checkpoint each partition's state with its next offset to a "
                           "compacted topic (in a Kafka transaction when the broker has "
                           "them) and publish alarm onsets with a deterministic id.")
    common(d, "consumer group (default assaywatch-detectors)")
    d.add_argument("--state-topic", metavar="TOPIC",
                   help="compacted checkpoint topic (default assaywatch.detector-state)")
    d.add_argument("--alarms-topic", metavar="TOPIC",
                   help="alarm onsets topic (default assaywatch.alarms; '' disables)")
    d.add_argument("--baseline", metavar="FILE", action="append", default=None,
                   help="baseline JSON from `assaywatch baseline build` (repeatable)")
    d.add_argument("--transactions", choices=["auto", "on", "off"],
                   help="checkpoint in Kafka transactions (default auto)")
    d.add_argument("--checkpoint-seconds", type=float, metavar="S",
                   help="seconds between checkpoints (default 1)")
    d.add_argument("--reorder-seconds", type=float, metavar="S",
                   help="process each partition's runs in end-time order within this "
                        "window (default 0: arrival order)")
    d.set_defaults(func=run_detect)


def _settings(args: argparse.Namespace, extra: dict[str, str]) -> tuple[Any, Any]:
    from assaywatch.monitor.commands._common import check_contracts
    from assaywatch.monitor.commands.errors import UsageError
    from assaywatch.monitor.config import ConfigError, parse_hostport
    from assaywatch.monitor.scaleout.settings import load_config

    try:
        cfg, ks = load_config(args.config)
        flags = {**_COMMON, **extra}
        for flag, attr in flags.items():
            value = getattr(args, flag, None)
            if value is None:
                continue
            if flag == "group":
                attr = "assemble_group" if args.action == "assemble" else "detect_group"
            setattr(ks, attr, value)
        ks.validate("flags")
        if args.metrics:
            parse_hostport(args.metrics, "--metrics")
        check_contracts(cfg, args.config or "config")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return cfg, ks


def _serve(view: Any, address: str | None, extra: Any = None) -> Any:
    if not address:
        return None
    from assaywatch.monitor.config import parse_hostport
    from assaywatch.monitor.exporters.status import StatusServer

    host, port = parse_hostport(address, "--metrics")
    server = StatusServer(view, host, port)
    if extra is not None:
        server.registry.register(extra)
    view.addresses["metrics"] = f"{host}:{server.start()}"
    return server


def _start(args: argparse.Namespace, worker: Any, what: str, stage: str) -> int:
    """Wait for the broker, create missing topics, serve metrics, run until a signal."""
    from assaywatch.monitor.commands.errors import UsageError
    from assaywatch.monitor.scaleout.clients import (
        KafkaUnavailable,
        ensure_topics,
        partition_count,
        wait_for_broker,
    )

    ks = worker.settings
    try:
        n = wait_for_broker(ks)
        if stage == "assemble":
            ensure_topics(ks, n, spans=True, runs=True, logs=True)
            if ks.logs_topic:
                logs, spans = (partition_count(ks, ks.logs_topic),
                               partition_count(ks, ks.spans_topic))
                if logs != spans:
                    from assaywatch.monitor.scaleout.assembler import logs_mismatch

                    raise UsageError(logs_mismatch(ks, logs, spans))
        else:
            ensure_topics(ks, n, runs=True, state=True, alarms=True)
            runs, state = partition_count(ks, ks.runs_topic), partition_count(ks, ks.state_topic)
            if state < runs:
                raise UsageError(f"state topic {ks.state_topic} has {state} partitions, fewer "
                                 f"than the {runs} of {ks.runs_topic}: give it at least as "
                                 "many (checkpoint of runs partition p goes to partition p)")
    except KafkaUnavailable as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # a KafkaException while creating topics
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"Kafka at {ks.bootstrap}: {exc}") from None
    server = _serve(worker, args.metrics, getattr(worker, "extra_collector", None))
    stop = worker.stop_event

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    failure: list[BaseException] = []

    def _run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # reported below, exit 1
            failure.append(exc)
            stop.set()

    from assaywatch.monitor.service import gc_policy

    gc_policy.tune()  # long-running, like the monitor: see gc_policy
    t = threading.Thread(target=_run, name=f"assaywatch-kafka-{stage}")
    t.start()
    worker.ready.wait(30)
    print(f"assaywatch kafka {stage} running " + " ".join(
        f"{k}={v}" for k, v in {"bootstrap": ks.bootstrap, **worker.addresses}.items()),
        flush=True)
    while t.is_alive():
        t.join(0.2)
    if server is not None:
        server.stop()
    if failure:
        exc = failure[0]
        if isinstance(exc, KafkaUnavailable):
            raise UsageError(str(exc)) from None
        print(f"assaywatch: kafka {stage} stopped: {exc}", file=sys.stderr)
        return 1
    print(f"assaywatch kafka {stage} stopped", flush=True)
    return 0


def _logging(args: argparse.Namespace) -> None:
    import faulthandler

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def _kafka_or_exit() -> None:
    from assaywatch.monitor.commands.errors import UsageError
    from assaywatch.monitor.scaleout.clients import KafkaUnavailable, require_kafka

    try:
        require_kafka()
    except KafkaUnavailable as exc:
        raise UsageError(str(exc)) from None


def run_assemble(args: argparse.Namespace) -> int:
    _logging(args)
    _kafka_or_exit()
    from assaywatch.monitor.scaleout.assembler import AssemblerWorker

    cfg, ks = _settings(args, {"spans_topic": "spans_topic", "logs_topic": "logs_topic",
                               "commit_seconds": "commit_seconds"})
    view = _AssemblerView(AssemblerWorker(ks, cfg))
    return _start(args, view, "assembler", "assemble")


def run_detect(args: argparse.Namespace) -> int:
    _logging(args)
    _kafka_or_exit()
    from assaywatch.monitor.commands.monitor import load_baselines
    from assaywatch.monitor.scaleout.detector import DetectorWorker, WorkerCollector

    cfg, ks = _settings(args, {"state_topic": "state_topic", "alarms_topic": "alarms_topic",
                               "transactions": "transactions",
                               "checkpoint_seconds": "checkpoint_seconds",
                               "reorder_seconds": "reorder_seconds"})
    baselines = load_baselines(list(cfg.baselines) + list(args.baseline or []))
    worker = DetectorWorker(ks, cfg, baselines)
    worker.extra_collector = WorkerCollector(worker)  # type: ignore[attr-defined]
    return _start(args, worker, "detector", "detect")


class _AssemblerView:
    """The assembler as the metrics port reads it: its edge counters, open traces, no
    streams (those are the detectors')."""

    def __init__(self, worker: Any) -> None:
        from assaywatch.monitor.engine.engine import Engine
        from assaywatch.monitor.scaleout.assembler import AssemblerCollector

        self.worker = worker
        self.settings = worker.settings
        self.engine = Engine(worker.config.detectors)
        self.counters = worker.counters
        self.pipeline = worker
        self.ready = worker.ready
        self.stop_event = worker.stop_event
        self.addresses = worker.addresses
        self.extra_collector = AssemblerCollector(worker)

    def run(self) -> None:
        self.worker.run()
