"""``assaywatch gate --baseline FILE --run COMMAND``: the live gate's command-line glue."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from assaywatch.monitor.offline.report import GateReport


def live_config(args: argparse.Namespace, policy: Any, n_streams: int) -> Any:
    from assaywatch.monitor.live.sequential import LiveConfig

    n_max = args.max_runs if args.max_runs is not None else int(policy.n_max)
    return LiveConfig(alpha=policy.alpha, beta=policy.beta, delta=policy.delta,
                      fingerprint_alpha=policy.fingerprint_alpha, theta=args.theta,
                      n_max=n_max, warm_start=not args.no_warm_start, n_streams=n_streams,
                      score_drop=policy.score_drop, scores_decide=policy.scores_decide)


def run_live(args: argparse.Namespace) -> int:
    from assaywatch.monitor.commands._common import usage_error
    from assaywatch.monitor.commands.gate_io import (
        baselines_from_inputs,
        load_policy,
        write_outputs,
    )
    from assaywatch.monitor.live.fidelity import FidelityConfig
    from assaywatch.monitor.live.receiver import LiveCollector
    from assaywatch.monitor.live.report import live_report
    from assaywatch.monitor.live.runner import LiveGate
    from assaywatch.monitor.live.streams import Caps, LiveUsageError
    from assaywatch.monitor.pipeline.outcome import ContractRules

    for name in ("max_runs", "jobs"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise usage_error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    for name in ("max_cost_usd", "max_seconds"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            raise usage_error(f"--{name.replace('_', '-')} must be > 0, got {v}")
    if args.theta is not None and not 0 < args.theta < 1:
        raise usage_error(f"--theta must lie strictly between 0 and 1, got {args.theta}")
    policy = load_policy(args.config)
    baselines, _ = baselines_from_inputs(args.baseline, args.strict, policy)
    if not baselines:
        raise usage_error(f"no baseline streams in {', '.join(args.baseline)}")
    scenarios = args.scenario or sorted({b.key.scenario for b in baselines})
    n_streams = sum(b.key.scenario in scenarios for b in baselines)
    try:
        config = live_config(args, policy, max(1, n_streams))
        rules = ContractRules.from_dict(policy.contracts) if policy.contracts else None
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    max_seconds = args.max_seconds or (policy.t_max_seconds or None)
    caps = Caps(max_runs=args.max_runs, max_cost_usd=args.max_cost_usd,
                max_seconds=max_seconds)
    collector = LiveCollector(rules=rules, score_threshold=policy.evaluation_threshold)
    try:
        collector.start()
    except OSError as exc:
        raise usage_error(str(exc)) from None
    try:
        gate = LiveGate(baselines, args.run, scenarios, config, caps, jobs=args.jobs,
                        loop=args.loop, collector=collector,
                        proxy_command=getattr(args, "proxy_run", None),
                        fidelity=FidelityConfig(cost_ratio=getattr(args, "proxy_cost_ratio",
                                                                   None)))
        gate.run()
    except LiveUsageError as exc:
        collector.stop()
        raise usage_error(str(exc)) from None
    inputs = {"baseline_files": args.baseline, "command": args.run, "scenarios": scenarios,
              "endpoint": collector.endpoint}
    if getattr(args, "proxy_run", None):
        inputs["proxy_command"] = args.proxy_run
    report = live_report(gate, policy, inputs)
    write_outputs(report, args)
    print_report(report, quiet=args.quiet)
    return int(report.exit_code)


def print_report(report: GateReport, quiet: bool = False) -> None:
    if not quiet:
        for s in report.streams:
            for t in s.tests:
                print(f"{s.name:40s} {t.name:12s} {t.verdict:13s} {t.message}")
        sp = report.spend
        print(f"spent {sp['runs']} runs ({sp['tokens']} tokens, {sp['seconds']:.1f} s, "
              f"{sp['failed_invocations']} failed invocations); a fixed-n design needs "
              f"{sp['fixed_n_runs']} runs (about {sp['fixed_n_tokens_estimate']} tokens)")
        if sp.get("proxy_runs") is not None:
            print(f"proxy: {sp['proxy_runs']} runs ({sp['proxy_tokens']} tokens); target + "
                  f"proxy cost {sp['total_cost_ratio_to_fixed_n']} of the fixed-n design's")
        if sp.get("stopped"):
            print(f"stopped early: {sp['stopped']}", file=sys.stderr)
    print(f"gate: {report.decision.upper()} (exit {report.exit_code}): {report.reason}")
