"""``assaywatch demo``: watch a monitor catch an injected regression, in a minute."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any


def register(sub: Any) -> None:
    from assaywatch.monitor.demo import REGRESSIONS

    p = sub.add_parser(
        "demo", help="run a monitor and a simulated agent with an injected regression",
        description=(
            "Start a monitor (temporary state dir, loopback ports) and a simulated tool-using "
            "support agent instrumented with assaywatch.instrumentation, exporting over real "
            "OTLP. The monitor learns a baseline from the first runs; after --at runs the "
            "agent regresses as chosen; a live view shows each detector's statistic against "
            "its threshold and the run at which each alarm fired. The status page and "
            "/metrics show the same while it runs."))
    p.add_argument("--regression", choices=REGRESSIONS, default="tool-mix",
                   help="what changes after --at runs (default tool-mix: same pass rate, "
                        "different tools)")
    p.add_argument("--at", type=int, default=200, metavar="N",
                   help="the run after which the agent regresses (default 200)")
    p.add_argument("--runs", type=int, default=400, metavar="N",
                   help="runs in all (default 400)")
    p.add_argument("--seed", type=int, default=7, help="random seed of the agent (default 7)")
    p.add_argument("--metrics", default="127.0.0.1:9464", metavar="HOST:PORT",
                   help="status page and /metrics address (default 127.0.0.1:9464; a busy "
                        "port falls back to a free one)")
    p.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                   help="keep the monitor and its status page up this long after the runs")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace, state_dir: str, metrics: str) -> Any:
    from assaywatch.monitor.config import MonitorConfig

    learn = max(30, min(150, (args.at * 3) // 4))
    return MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "127.0.0.1:0", "otlp_http": "", "metrics": metrics},
        "assembler": {"grace_seconds": 0.3},
        "detectors": {"learn_runs": learn, "hotelling_window": 100, "hotelling_every": 10},
        "state_dir": state_dir,
    }, "demo defaults")


def run(args: argparse.Namespace) -> int:
    from assaywatch.monitor.errors import UsageError

    if args.runs < 2 or not 0 < args.at < args.runs:
        raise UsageError("need 0 < --at < --runs (for example --runs 400 --at 200)")
    with tempfile.TemporaryDirectory(prefix="assaywatch-demo-") as state_dir:
        return _run(args, state_dir)


def _start_monitor(args: argparse.Namespace, state_dir: str) -> Any:
    from assaywatch.monitor.service import Monitor

    try:
        mon = Monitor(_config(args, state_dir, args.metrics))
        mon.start()
        return mon
    except OSError:
        mon.stop()
        mon = Monitor(_config(args, state_dir, "127.0.0.1:0"))
        mon.start()
        return mon


def _run(args: argparse.Namespace, state_dir: str) -> int:
    from rich.console import Console

    from assaywatch.instrumentation import instrument
    from assaywatch.monitor.demo import SupportAgent, regressed
    from assaywatch.monitor.demo_view import DemoView

    console = Console(stderr=False)
    mon = _start_monitor(args, state_dir)
    metrics = mon.addresses["metrics"]
    console.print(f"assaywatch demo: monitor up. Status page http://{metrics}/  "
                  f"metrics http://{metrics}/metrics", highlight=False, soft_wrap=True)
    console.print(f"simulated agent: {args.runs} runs, regression '{args.regression}' after "
                  f"run {args.at}; the monitor learns its baseline from the first "
                  f"{mon.config.detectors.learn_runs} runs.", highlight=False, soft_wrap=True)
    instrument(endpoint=f"http://{mon.addresses['otlp_grpc']}", protocol="grpc",
               service_name="support-agent-demo", frameworks=[])
    agent = SupportAgent(args.seed)
    view = DemoView(mon, args, console)
    interrupted = False
    try:
        with view:
            for i in range(args.runs):
                if i == args.at:
                    agent.behaviour = regressed(args.regression)
                agent.run_once(i)
                view.sent = i + 1
                view.refresh()
            _flush()
            deadline = time.monotonic() + 30
            while view.processed() < args.runs and time.monotonic() < deadline:
                view.refresh()
                time.sleep(0.1)
            view.refresh()
        if args.hold > 0:
            console.print(f"holding the status page open for {args.hold:g} s (Ctrl-C ends)")
            time.sleep(args.hold)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        _flush()
        mon.stop()
    view.summary(interrupted)
    return 130 if interrupted else 0


def _flush() -> None:
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        try:
            flush(5_000)
        except Exception:  # the demo's own exporter: nothing to lose at exit
            print("warning: could not flush spans", file=sys.stderr)
