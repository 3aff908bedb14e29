"""The gate's inputs and outputs, shared by the recorded gate (``gate.py``), the live gate
(``gate_live.py``) and ``baseline``, ``plan`` and ``mutate``: the gate config, baselines
from baseline JSON or span files, and the JUnit / HTML / Markdown writers."""

from __future__ import annotations

import argparse
import os
from typing import Any


def load_policy(path: str | None) -> Any:
    from assaywatch.monitor.commands._common import config_kind_hint, usage_error
    from assaywatch.monitor.offline.gate import GatePolicy

    if not path:
        return GatePolicy()
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise usage_error(f"cannot read gate config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise usage_error(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise usage_error(f"{path}: the top level must be a mapping of options")
    try:
        return GatePolicy.from_mapping(data, where=path)
    except (ValueError, TypeError) as exc:
        raise usage_error(str(exc) + config_kind_hint(path, "gate")) from None


def baselines_from_inputs(paths: list[str], strict: bool, policy: Any,
                          keep_runs: list[Any] | None = None) -> tuple[list[Any], Any]:
    """Baselines from baseline JSON files and/or span files of the known-good version; the
    span files' runs are appended to ``keep_runs`` when given (for trace-first checks)."""
    from assaywatch.monitor.commands._common import (
        build_baselines,
        is_baseline_file,
        load_runs,
        read_baselines,
    )

    files = [p for p in paths if is_baseline_file(p)]
    spans = [p for p in paths if p not in files]
    baselines = read_baselines(files)
    stats = None
    if spans:
        runs, stats = load_runs(spans, strict=strict, policy=policy,
                                role="baseline span")
        baselines.extend(build_baselines(runs, source=", ".join(spans)))
        if keep_runs is not None:
            keep_runs.extend(runs)
    return baselines, stats


def write_outputs(report: Any, args: argparse.Namespace) -> None:
    from assaywatch.monitor.commands._common import usage_error

    try:
        if args.junit:
            from assaywatch.monitor.offline.junit import write_junit

            write_junit(report, args.junit)
        if args.report:
            from assaywatch.monitor.offline.html_report import write_html

            write_html(report, args.report)
        if args.markdown:
            from assaywatch.monitor.offline.markdown import markdown_summary

            with open(args.markdown, "a" if os.path.exists(args.markdown) else "w",
                      encoding="utf-8") as fh:
                fh.write(markdown_summary(report) + "\n")
    except OSError as exc:
        raise usage_error(f"cannot write {exc.filename}: {exc.strerror}") from None
