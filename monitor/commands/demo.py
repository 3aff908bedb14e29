"""``assaywatch demo``: watch a monitor catch an injected regression, in a minute.

Everything runs in this process on loopback: a :class:`~assaywatch.monitor.service.Monitor`
with a temporary state dir, and the simulated support agent of
:mod:`assaywatch.monitor.demo.agent` exporting over real OTLP/gRPC through the public
``assaywatch.instrumentation`` API. Precedence for the run count and the metrics address:
flag > environment variable (:data:`DEMO_ENV_VARS`) > default.

Ctrl-C stops the agent, flushes and shuts down the exporter, stops the monitor and prints
a partial summary (exit code 130); a second Ctrl-C during that clean-up exits at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import time
from typing import Any

DEFAULT_RUNS = 400
DEFAULT_METRICS = "127.0.0.1:9464"

#: Environment variables read by ``assaywatch demo`` (flag > env > default).
DEMO_ENV_VARS = {
    "ASSAYWATCH_DEMO_RUNS": f"runs of the demo when --runs is not given (default "
                            f"{DEFAULT_RUNS}); --at then defaults to half of it",
    "ASSAYWATCH_METRICS": "the demo's status page and /metrics address when --metrics is "
                          "not given (the monitor reads it too)",
}


def register(sub: Any) -> None:
    from assaywatch.monitor.demo.agent import REGRESSIONS

    p = sub.add_parser(
        "demo", help="run a monitor and a simulated agent with an injected regression",
        description=(
            "Start a monitor (temporary state dir, loopback ports) and a simulated tool-using "
            "support agent instrumented with assaywatch.instrumentation, exporting over real "
            "OTLP. The monitor learns a baseline from the first runs; after --at runs the "
            "agent regresses as chosen; a live view shows each detector's statistic against "
            "its threshold and the run at which each alarm fired. The status page and "
            "/metrics show the same while it runs. Ctrl-C ends it cleanly (exit 130)."))
    p.add_argument("--regression", choices=REGRESSIONS, default="tool-mix",
                   help="what changes after --at runs (default tool-mix: same pass rate, "
                        "different tools)")
    p.add_argument("--at", type=int, default=None, metavar="N",
                   help="the run after which the agent regresses (default: half of --runs)")
    p.add_argument("--runs", type=int, default=None, metavar="N",
                   help=f"runs in all (default {DEFAULT_RUNS}, or $ASSAYWATCH_DEMO_RUNS)")
    p.add_argument("--seed", type=int, default=7, help="random seed of the agent (default 7)")
    p.add_argument("--metrics", default=None, metavar="HOST:PORT",
                   help=f"status page and /metrics address (default {DEFAULT_METRICS}, or "
                        "$ASSAYWATCH_METRICS; a busy port falls back to a free one)")
    p.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                   help="keep the monitor and its status page up this long after the runs")
    p.set_defaults(func=run)


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None) -> None:
    """Fill ``runs``, ``at`` and ``metrics`` from the environment and defaults, validated."""
    from assaywatch.monitor.commands.errors import UsageError

    env = os.environ if environ is None else environ
    if args.runs is None:
        raw = env.get("ASSAYWATCH_DEMO_RUNS", "").strip()
        try:
            args.runs = int(raw) if raw else DEFAULT_RUNS
        except ValueError:
            raise UsageError(f"ASSAYWATCH_DEMO_RUNS must be a whole number of runs, got "
                             f"{raw!r}") from None
    if args.at is None:
        args.at = args.runs // 2
    if args.metrics is None:
        args.metrics = env.get("ASSAYWATCH_METRICS", "").strip() or DEFAULT_METRICS
    from assaywatch.monitor.config import ConfigError, parse_hostport

    try:
        parse_hostport(args.metrics, "--metrics (or ASSAYWATCH_METRICS)")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.runs < 2 or not 0 < args.at < args.runs:
        raise UsageError(f"need 0 < --at < --runs, got --at {args.at} --runs {args.runs} "
                         "(for example --runs 400 --at 200)")
    if args.hold < 0:
        raise UsageError(f"--hold must be 0 or more seconds, got {args.hold:g}")


def run(args: argparse.Namespace) -> int:
    resolve(args)
    with tempfile.TemporaryDirectory(prefix="assaywatch-demo-") as state_dir:
        return _run(args, state_dir)


def _config(args: argparse.Namespace, state_dir: str, metrics: str) -> Any:
    from assaywatch.monitor.config import MonitorConfig

    # Learn from three quarters of the pre-regression runs (30..150): enough runs for a
    # baseline covariance on the few effective fingerprint dimensions, and a stretch of
    # monitored in-control runs before the regression, where an alarm would be false.
    learn = max(30, min(150, (args.at * 3) // 4))
    return MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "127.0.0.1:0", "otlp_http": "", "metrics": metrics},
        "assembler": {"grace_seconds": 0.3},
        "detectors": {"learn_runs": learn, "hotelling_window": 100, "hotelling_every": 10},
        "state_dir": state_dir,
    }, "demo defaults")


def _start_monitor(args: argparse.Namespace, state_dir: str) -> Any:
    from assaywatch.monitor.service.monitor import Monitor

    mon = Monitor(_config(args, state_dir, args.metrics))
    try:
        mon.start()
        return mon
    except OSError:  # the metrics port is taken (a real monitor?): use a free one
        mon.stop()
    mon = Monitor(_config(args, state_dir, "127.0.0.1:0"))
    mon.start()
    return mon


class _AlarmLogFilter(logging.Filter):
    """Drop the service's own alarm lines: the view reports every alarm already."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "assaywatch.monitor.service.monitor"
                    and str(record.msg).startswith("alarm "))


class _StderrHandler(logging.Handler):
    """Write to the *current* ``sys.stderr``, which rich's live display redirects above
    itself, so a warning never tears the table apart."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # logging must never stop the demo
            self.handleError(record)


def _configure_logging() -> logging.Handler:
    handler = _StderrHandler(logging.WARNING)
    handler.addFilter(_AlarmLogFilter())
    handler.setFormatter(logging.Formatter("assaywatch demo: %(levelname)s: %(message)s"))
    logger = logging.getLogger("assaywatch")
    logger.addHandler(handler)
    return handler


def _run(args: argparse.Namespace, state_dir: str) -> int:
    from rich.console import Console

    from assaywatch.instrumentation import instrument
    from assaywatch.monitor.demo.agent import SupportAgent, regressed
    from assaywatch.monitor.demo.view import DemoView

    handler = _configure_logging()
    console = Console()
    mon = _start_monitor(args, state_dir)
    interrupted = False
    view: DemoView | None = None
    try:
        metrics = mon.addresses["metrics"]
        console.print(f"assaywatch demo: monitor up. Status page http://{metrics}/  "
                      f"metrics http://{metrics}/metrics", highlight=False, soft_wrap=True)
        console.print(f"simulated agent: {args.runs} runs, regression '{args.regression}' "
                      f"after run {args.at}; the monitor learns its baseline from the first "
                      f"{mon.config.detectors.learn_runs} runs.", highlight=False,
                      soft_wrap=True)
        console.file.flush()
        instrument(endpoint=f"http://{mon.addresses['otlp_grpc']}", protocol="grpc",
                   service_name="support-agent-demo", frameworks=[])
        agent = SupportAgent(args.seed)
        view = DemoView(mon, args, console)
        with view:
            for i in range(args.runs):
                if i == args.at:
                    agent.behaviour = regressed(args.regression)
                    view.regression_injected(i)
                agent.run_once(i)
                view.sent = i + 1
                view.refresh()
            _flush_tracing(shutdown=False)
            deadline = time.monotonic() + 30
            while view.processed() < args.runs and time.monotonic() < deadline:
                view.refresh()
                time.sleep(0.1)
            view.refresh()
        if args.hold > 0:
            console.print(f"holding the status page http://{metrics}/ open for "
                          f"{args.hold:g} s (Ctrl-C ends)", highlight=False)
            console.file.flush()
            time.sleep(args.hold)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        previous = signal.signal(signal.SIGINT, _force_exit) if _main_thread() else None
        try:
            _flush_tracing(shutdown=True)
            mon.stop()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            logging.getLogger("assaywatch").removeHandler(handler)
    if view is not None:
        view.summary(interrupted)
    return 130 if interrupted else 0


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _force_exit(signum: int, frame: Any) -> None:
    print("\nassaywatch demo: interrupted again during clean-up, exiting now", file=sys.stderr,
          flush=True)
    os._exit(130)


def _flush_tracing(shutdown: bool) -> None:
    """Push the agent's buffered spans to the monitor; with ``shutdown`` also stop the
    exporter, so nothing retries against the monitor after it stopped."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    try:
        flush = getattr(provider, "force_flush", None)
        if flush is not None:
            flush(5_000)
        stop = getattr(provider, "shutdown", None)
        if shutdown and stop is not None:
            stop()
    except Exception:  # the demo's own exporter: nothing to lose at exit
        print("assaywatch demo: warning: could not flush the agent's spans", file=sys.stderr)
