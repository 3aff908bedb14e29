"""``assaywatch replay``: backtest the monitor's detectors over recorded spans."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "replay", help="print when each alarm would have fired over recorded spans",
        description=(
            "Run the monitor's own pipeline and detectors over span files in time order "
            "(runs in the order the live monitor would close them) and print every alarm "
            "onset with its evidence: a backtest of alert settings before turning them on. "
            "The same spans give the same alarms, at the same runs, as the live monitor."))
    p.add_argument("files", nargs="+", metavar="FILE", help="span files")
    p.add_argument("--config", metavar="FILE", help="monitor config YAML (its detectors, "
                   "assembler and contracts sections are used)")
    p.add_argument("--baseline", action="append", default=None, metavar="FILE",
                   help="baseline JSON (repeatable); streams without one learn it from "
                        "their first runs")
    p.add_argument("--json", action="store_true", help="one JSON object per alarm")
    p.add_argument("--strict", action="store_true", help="fail on the first bad record")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from assaywatch.monitor.commands._common import (
        check_contracts,
        check_files,
        check_loaded,
        config_kind_hint,
        read_baselines,
        usage_error,
    )
    from assaywatch.monitor.config import ConfigError, MonitorConfig
    from assaywatch.monitor.offline.replay import replay
    from assaywatch.monitor.receivers.files.errors import SpanFileError

    check_files(args.files, "span file")
    try:
        cfg = MonitorConfig.load(args.config) if args.config else MonitorConfig()
        check_contracts(cfg, args.config or "config")
    except ConfigError as exc:
        raise usage_error(str(exc) + config_kind_hint(args.config, "monitor")) from None
    baselines = read_baselines(list(cfg.baselines) + list(args.baseline or []))
    try:
        result = replay(args.files, cfg, baselines, strict=args.strict)
    except SpanFileError as exc:
        raise usage_error(f"{exc} (use without --strict to skip bad records)") from None
    check_loaded(args.files, result.stats.runs, result.stats, "span")
    for ev in result.alarms:
        if args.json:
            print(json.dumps(ev.to_dict(), sort_keys=True, default=str))
        else:
            print(f"{ev.key}  run {ev.run_index:6d}  {ev.detector:18s} run_id={ev.run_id} "
                  f"evidence={json.dumps(ev.evidence, default=str, sort_keys=True)}")
    for st in result.streams:
        state = ("learning" if st.baseline is None
                 else f"baseline {st.baseline.n_runs} runs ({st.baseline_origin})")
        print(f"# {st.key}: {st.n_runs} runs, {state}, alarms "
              f"{dict(st.alarms_total) or 'none'}")
    print(f"# {len(result.alarms)} alarm onset(s) over {result.stats.runs} runs "
          f"from {result.stats.spans} spans")
    return 0
