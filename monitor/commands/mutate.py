"""``assaywatch mutate``: how well the configured detectors catch trace-level mutants.

The baseline's recorded runs are split in time per stream (the first ``--split`` share
freezes a baseline); the rest is mutated by each operator (monitor/offline/mutate.py) and
judged by the gate's tests and/or the monitor's detectors. Kills are statistical decisions
(Holm-adjusted gate tests at alpha; detector alarms at their calibrated ARL0); the no-op
control shows the false-kill rate in practice. Exit 0, or 1 when ``--min-score`` is not
met (or the control is killed), 3 on invalid input.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "mutate", help="score how well the detectors catch trace-level mutants",
        description="Mutation adequacy of the configured detectors: drop a tool's spans, "
                    "swap the model, inject error spans, truncate outputs, reorder steps "
                    "(plus a no-op control), each replayed against a baseline frozen from "
                    "the first part of the recorded runs. Mutation score = killed / "
                    "non-equivalent mutants.")
    p.add_argument("--baseline", required=True, nargs="+", metavar="FILE",
                   help="span files of the known-good version (runs are needed, not a "
                        "baseline JSON)")
    p.add_argument("--config", metavar="FILE", help="monitor config YAML: its detectors, "
                   "assembler and contracts sections are used")
    p.add_argument("--gate-config", metavar="FILE", help="gate config YAML for the gate "
                   "method (alpha, fingerprint_alpha, delta, ...)")
    p.add_argument("--method", choices=("gate", "monitor", "both"), default="both",
                   help="which decides a kill (default both, reported separately)")
    p.add_argument("--runs", type=int, metavar="N", help="use only the first N runs")
    p.add_argument("--split", type=float, default=0.5, metavar="F",
                   help="share of each stream's runs (the earliest) frozen as the baseline "
                        "(default 0.5)")
    p.add_argument("--fraction", type=float, default=1.0, metavar="F",
                   help="probability that a held-out run is mutated (default 1)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="operators' seed")
    p.add_argument("--min-score", type=float, metavar="X",
                   help="exit 1 when a method's mutation score is below X or its no-op "
                        "control was killed")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--strict", action="store_true", help="fail on the first bad record")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from assaywatch.monitor.commands._common import (
        check_files,
        check_loaded,
        config_kind_hint,
        is_baseline_file,
        usage_error,
    )
    from assaywatch.monitor.commands.gate_io import load_policy
    from assaywatch.monitor.config import ConfigError, MonitorConfig
    from assaywatch.monitor.offline.load import load_runs
    from assaywatch.monitor.offline.mutate import mutation_test
    from assaywatch.monitor.pipeline.outcome import ContractRules
    from assaywatch.monitor.receivers.files.errors import SpanFileError

    check_files(args.baseline, "baseline file")
    js = [p for p in args.baseline if is_baseline_file(p)]
    if js:
        raise usage_error(f"{js[0]} is a baseline JSON; mutate needs the recorded span files "
                          "(the runs themselves), e.g. the files given to `baseline build`")
    try:
        cfg = MonitorConfig.load(args.config) if args.config else MonitorConfig()
    except ConfigError as exc:
        raise usage_error(str(exc) + config_kind_hint(args.config, "monitor")) from None
    policy = load_policy(args.gate_config)
    try:
        rules = ContractRules.from_dict(cfg.contracts) if cfg.contracts else None
    except ValueError as exc:
        raise usage_error(f"contracts: {exc}") from None
    try:
        runs, stats = load_runs(args.baseline, strict=args.strict, rules=rules,
                                score_threshold=cfg.evaluation_threshold)
    except SpanFileError as exc:
        raise usage_error(f"{exc} (use without --strict to skip bad records)") from None
    check_loaded(args.baseline, len(runs), stats, "baseline span")
    if args.runs is not None:
        if args.runs < 4:
            raise usage_error(f"--runs must be at least 4, got {args.runs}")
        runs = runs[:args.runs]
    methods = ("gate", "monitor") if args.method == "both" else (args.method,)
    try:
        report = mutation_test(runs, methods=methods, policy=policy, detectors=cfg.detectors,
                               rules=rules, score_threshold=cfg.evaluation_threshold,
                               split=args.split, fraction=args.fraction, seed=args.seed)
    except ValueError as exc:
        raise usage_error(f"{', '.join(args.baseline)}: {exc}") from None
    doc = report.to_dict()
    doc["inputs"] = {"files": args.baseline, **stats.to_dict()}
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        name_w = max([len(r.name) for r in report.results] + [6])
        print(f"{'mutant':{name_w}s}  changed  " + "  ".join(f"{m:9s}" for m in methods)
              + "  evidence")
        for r in report.results:
            status = "  ".join(f"{('control:' if r.control else '') + r.status(m):9s}"
                               for m in methods)
            ev = " | ".join(r.evidence.get(m, "") for m in methods)
            print(f"{r.name:{name_w}s}  {r.changed_runs:7d}  {status}  {ev}")
        for m in methods:
            k, n = report.score(m)
            ctl = "KILLED (kills untrustworthy)" if report.control_killed(m) else "not killed"
            print(f"# {m}: mutation score {k}/{n}" + (f" = {k / n:.2f}" if n else "")
                  + f"; no-op control {ctl}")
        print(f"# baseline part {report.baseline_runs} runs, mutated part "
              f"{report.mutant_runs} runs, seed {args.seed}")
    if args.min_score is not None:
        for m in methods:
            k, n = report.score(m)
            if report.control_killed(m) or (n and k / n < args.min_score):
                return 1
    return 0
