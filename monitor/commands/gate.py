"""``assaywatch gate``: the pre-deploy gate from recorded spans (exit 0 / 1 / 2 / 3)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "gate", help="decide deploy / block / manual review from recorded spans",
        description=(
            "Compare a candidate's runs with a baseline per stream (agent, scenario): "
            "pass-rate regression verdict (one-sided Fisher, planned power), behaviour shift "
            "(Hotelling T^2 on projected fingerprints) and coverage, with Holm-Bonferroni "
            "across streams. Exit 0 deploy, 1 block, 2 manual review, 3 invalid input or "
            "usage."),
        epilog="A significant pass-rate regression blocks; a significant behaviour shift "
               "without one asks for manual review (behaviour_shift: block in the config "
               "makes it block); too few runs give Inconclusive, i.e. manual review.")
    p.add_argument("--baseline", required=True, nargs="+", metavar="FILE",
                   help="baseline JSON from `assaywatch baseline build`, or span files of the "
                        "known-good version")
    p.add_argument("--candidate", nargs="+", metavar="FILE",
                   help="span files of the candidate version (or --run)")
    live = p.add_argument_group(
        "live gate", "run the candidate until the verdict is decided. COMMAND is started "
        "once per wanted run with OTEL_EXPORTER_OTLP_ENDPOINT pointing at the gate's own "
        "receiver and ASSAYWATCH_SCENARIO and ASSAYWATCH_RUN_INDEX set; with --loop it is "
        "started once per job, reads 'run SCENARIO INDEX' lines on stdin and prints 'done' "
        "after each run's spans are flushed")
    live.add_argument("--run", metavar="COMMAND",
                      help="run this shell command repeatedly, one agent run per invocation "
                           "(or --loop), with OTEL_EXPORTER_OTLP_ENDPOINT set to an embedded "
                           "receiver; stops at the first sequential decision")
    live.add_argument("--scenario", action="append", metavar="NAME",
                      help="scenario to run (repeatable; default: the baseline's scenarios); "
                           "passed to COMMAND as ASSAYWATCH_SCENARIO")
    live.add_argument("--max-runs", type=int, metavar="N",
                      help="cap on candidate runs per stream (default: n_max of the config)")
    live.add_argument("--max-cost-usd", type=float, metavar="X",
                      help="stop when the runs' reported cost reaches X dollars")
    live.add_argument("--max-seconds", type=float, metavar="T",
                      help="stop after T seconds of wall time (default: t_max_seconds)")
    live.add_argument("--jobs", type=int, default=1, metavar="K",
                      help="runs in flight at once (default 1)")
    live.add_argument("--loop", action="store_true",
                      help="COMMAND loops: it reads 'run <scenario> <index>' lines on stdin "
                           "and prints 'done' after each run")
    live.add_argument("--theta", type=float, metavar="P",
                      help="pass rate the SPRT must keep (default: the baseline's)")
    live.add_argument("--no-warm-start", action="store_true",
                      help="start the SPRT cold instead of from the baseline's runs")
    live.add_argument("--proxy-run", metavar="COMMAND",
                      help="multi-fidelity: a cheaper configuration of the candidate, run "
                           "on the same scenario and ASSAYWATCH_TRIAL_INDEX after each target "
                           "run (plus extra runs on fresh indices); used only when its "
                           "measured correlation with the target makes it pay "
                           "(control variates)")
    live.add_argument("--proxy-cost-ratio", type=float, metavar="X",
                      help="proxy cost per run / target cost per run (default: measured "
                           "from the runs' cost_usd or tokens)")
    p.add_argument("--config", metavar="FILE", help="gate config YAML (alpha, beta, delta, "
                   "theta, c_min, n_max, test, behaviour_shift, contracts, ...)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    p.add_argument("--report", metavar="FILE", help="write the HTML report here")
    p.add_argument("--markdown", metavar="FILE",
                   help="write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--strict", action="store_true",
                   help="fail (exit 3) on the first bad record instead of skipping it")
    p.add_argument("--quiet", action="store_true", help="print only the decision line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from assaywatch.monitor.commands._common import check_files, load_runs, usage_error
    from assaywatch.monitor.commands.gate_io import (
        baselines_from_inputs,
        load_policy,
        write_outputs,
    )
    from assaywatch.monitor.offline.gate import decide

    if bool(args.candidate) == bool(args.run):
        raise usage_error("give exactly one of --candidate FILES... (recorded spans) or "
                          "--run COMMAND (live gate)")
    if (args.proxy_run or args.proxy_cost_ratio is not None) and not args.run:
        raise usage_error("--proxy-run and --proxy-cost-ratio need --run COMMAND")
    if args.proxy_cost_ratio is not None and not args.proxy_cost_ratio > 0:
        raise usage_error(f"--proxy-cost-ratio must be > 0, got {args.proxy_cost_ratio}")
    check_files(args.baseline, "baseline file")
    if args.run:
        from assaywatch.monitor.commands.gate_live import run_live

        return run_live(args)
    check_files(args.candidate, "candidate file")
    policy = load_policy(args.config)
    baseline_runs: list[Any] = []
    baselines, bstats = baselines_from_inputs(args.baseline, args.strict, policy,
                                              keep_runs=baseline_runs)
    if not baselines:
        raise usage_error(f"no baseline streams in {', '.join(args.baseline)}")
    runs, stats = load_runs(args.candidate, strict=args.strict, policy=policy,
                            role="candidate")
    inputs = {"baseline_files": args.baseline, "candidate_files": args.candidate,
              "candidate": stats.to_dict()}
    if bstats is not None:
        inputs["baseline"] = bstats.to_dict()
    report = decide(baselines, runs, policy, inputs=inputs,
                    baseline_runs=baseline_runs if bstats is not None else None)
    write_outputs(report, args)
    if not args.quiet:
        for s in report.streams:
            for t in s.tests:
                print(f"{s.name:40s} {t.name:12s} {t.verdict:13s} {t.message}")
        if stats.issues:
            print(f"skipped {stats.issues} bad records; first: {stats.issue_samples[0]}",
                  file=sys.stderr)
    print(f"gate: {report.decision.upper()} (exit {report.exit_code}): {report.reason}")
    return int(report.exit_code)
