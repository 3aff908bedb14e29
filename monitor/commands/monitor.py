"""``assaywatch monitor``: receive OTLP spans, assay every agent stream, export metrics."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "monitor",
        help="run the monitor service (OTLP in, Prometheus metrics out)",
        description=(
            "Receive OTLP span streams (gRPC and HTTP), assemble agent runs, compare each "
            "stream (agent, version, scenario) with its frozen baseline using SPRT, CUSUM "
            "and Hotelling T^2, and export verdicts, alarms and coverage as Prometheus "
            "metrics. Binds loopback by default; pass 0.0.0.0:PORT to listen on all "
            "interfaces. A port of 0 picks a free port (the bound addresses are printed)."),
    )
    p.add_argument("--config", metavar="FILE", default=os.environ.get("ASSAYWATCH_CONFIG"),
                   help="YAML configuration file (env ASSAYWATCH_CONFIG)")
    p.add_argument("--state-dir", metavar="DIR", default=None,
                   help="directory for checkpoints and the alarm event log "
                        "(env ASSAYWATCH_STATE_DIR; default: in memory only)")
    p.add_argument("--baseline", metavar="FILE", action="append", default=None,
                   help="baseline JSON from `assaywatch baseline build` (repeatable)")
    p.add_argument("--otlp-grpc", metavar="HOST:PORT", default=None,
                   help="OTLP/gRPC listen address (default 127.0.0.1:4317; '' disables)")
    p.add_argument("--otlp-http", metavar="HOST:PORT", default=None,
                   help="OTLP/HTTP listen address (default 127.0.0.1:4318; '' disables)")
    p.add_argument("--metrics", metavar="HOST:PORT", default=None,
                   help="metrics, health and status page address (default 127.0.0.1:9464)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log verbosity")
    p.set_defaults(func=run)


def load_config(args: argparse.Namespace) -> Any:
    from assaywatch.monitor.commands._common import check_contracts, config_kind_hint
    from assaywatch.monitor.commands.errors import UsageError
    from assaywatch.monitor.config import ConfigError, MonitorConfig, parse_hostport

    try:
        cfg = MonitorConfig.load(args.config) if args.config else MonitorConfig()
        env = os.environ
        for flag, env_name, attr in (("otlp_grpc", "ASSAYWATCH_OTLP_GRPC", "otlp_grpc"),
                                     ("otlp_http", "ASSAYWATCH_OTLP_HTTP", "otlp_http"),
                                     ("metrics", "ASSAYWATCH_METRICS", "metrics")):
            value = getattr(args, flag)
            if value is None:
                value = env.get(env_name)
            if value is not None:
                if value:
                    parse_hostport(value, f"--{flag.replace('_', '-')}")
                setattr(cfg.listen, attr, value)
        state_dir = args.state_dir if args.state_dir is not None else env.get(
            "ASSAYWATCH_STATE_DIR")
        if state_dir is not None:
            cfg.state_dir = state_dir
        if args.baseline:
            cfg.baselines = list(cfg.baselines) + list(args.baseline)
        if not cfg.listen.metrics:
            raise ConfigError("the metrics address cannot be empty")
        check_contracts(cfg, args.config or "config")
    except ConfigError as exc:
        raise UsageError(str(exc) + config_kind_hint(args.config, "monitor")) from None
    return cfg


def load_baselines(paths: list[str]) -> list[Any]:
    from assaywatch.analyzers.baseline_file import baselines_from_json
    from assaywatch.monitor.commands.errors import UsageError

    out = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                out.extend(baselines_from_json(fh.read()))
        except OSError as exc:
            raise UsageError(f"cannot read baseline file {path}: {exc.strerror}") from None
        except ValueError as exc:
            raise UsageError(f"{path}: not a baseline file: {exc}") from None
    return out


def run(args: argparse.Namespace) -> int:
    from assaywatch.monitor.service.monitor import Monitor

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from assaywatch.monitor.commands.errors import UsageError
    from assaywatch.monitor.service.state import StateError

    cfg = load_config(args)
    from assaywatch.monitor.service import gc_policy

    # a long-running process (see gc_policy); before the state is restored, so that
    # streams read from a checkpoint stay within the collector's reach
    gc_policy.tune()
    try:
        monitor = Monitor(cfg, load_baselines(cfg.baselines))
    except StateError as exc:
        raise UsageError(str(exc)) from None
    try:
        addresses = monitor.start()
    except (OSError, StateError) as exc:
        monitor.stop(save=False)
        raise UsageError(str(exc)) from None
    print("assaywatch monitor listening " + " ".join(f"{k}={v}" for k, v in addresses.items()),
          flush=True)
    done = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    done.wait()
    monitor.stop()
    print("assaywatch monitor stopped; state saved" if cfg.state_dir else
          "assaywatch monitor stopped", flush=True)
    return 0
