"""Helpers shared by the offline commands: reading span files and baselines, clearly."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def usage_error(message: str) -> Exception:
    from assaywatch.monitor.commands.errors import UsageError

    return UsageError(message)


def check_files(paths: Sequence[str], what: str) -> None:
    for p in paths:
        if not Path(p).is_file():
            raise usage_error(f"{what} {p}: no such file")


def is_baseline_file(path: str) -> bool:
    """A baseline JSON (from `baseline build`) rather than a span export."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and b'"baselines"' in head


def read_baselines(paths: Sequence[str]) -> list[Any]:
    from assaywatch.analyzers.baseline_file import baselines_from_json

    out = []
    for p in paths:
        try:
            text = Path(p).read_text(encoding="utf-8")
            out.extend(baselines_from_json(text, where=p))
        except OSError as exc:
            raise usage_error(f"cannot read baseline file {p}: {exc.strerror}") from None
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise usage_error(f"{p}: not a valid baseline file: {exc}") from None
    return out


def load_runs(paths: Sequence[str], *, strict: bool, policy: Any = None,
              role: str = "span") -> tuple[list[Any], Any]:
    """Runs of span files. Exit 3 (a usage error naming the files) for a strict-mode read
    error, an unreadable or truncated file, or files that yield no run at all: an input
    problem must never reach the gate as a verdict about the agent. ``role`` names the
    files in the message ("candidate", "baseline span", ...)."""
    from assaywatch.monitor.offline.load import load_runs as _load
    from assaywatch.monitor.pipeline.outcome import ContractRules
    from assaywatch.monitor.receivers.files.errors import SpanFileError

    rules = None
    threshold = 0.5
    keys: tuple[str, ...] = ()
    if policy is not None:
        threshold = policy.evaluation_threshold
        keys = tuple(getattr(policy, "key_attributes", ()) or ())
        if policy.contracts:
            try:
                rules = ContractRules.from_dict(policy.contracts)
            except ValueError as exc:
                raise usage_error(f"contracts: {exc}") from None
    try:
        runs, stats = _load(paths, strict=strict, rules=rules, score_threshold=threshold,
                            key_attributes=keys)
    except SpanFileError as exc:
        raise usage_error(f"{exc} (use without --strict to skip bad records)") from None
    except OSError as exc:
        raise usage_error(f"cannot read {exc.filename}: {exc.strerror}") from None
    check_loaded(paths, len(runs), stats, role)
    return runs, stats


def build_baselines(runs: Sequence[Any], tools: Sequence[str] | None = None,
                    source: str = "") -> list[Any]:
    from assaywatch.analyzers.baseline import BaselineBuilder

    builders: dict[Any, Any] = {}
    for run in runs:
        b = builders.get(run.key)
        if b is None:
            b = builders[run.key] = BaselineBuilder(
                run.key, tools=list(tools) if tools else None,
                tool_source="config" if tools else "observed", source=source)
        b.add(run)
    return [builders[k].freeze() for k in sorted(builders)]


def check_loaded(paths: Sequence[str], n_runs: int, stats: Any, role: str) -> None:
    """Exit 3 when span files were unreadable or truncated, or yielded no run at all."""
    if stats.file_issues:
        raise usage_error(f"{role} file {stats.file_issues[0]}; fix or re-export the file")
    if n_runs == 0:
        found = (f"{stats.spans} spans read, none forming an agent run"
                 if stats.spans else "no spans read")
        skipped = (f"; {stats.issues} bad records skipped, first: {stats.issue_samples[0]}"
                   if stats.issues else "")
        raise usage_error(
            f"{role} files {', '.join(paths)}: {found}{skipped}. Give OTLP JSON Lines or "
            "Collector proto span exports of the agent (`assaywatch record`, "
            "ASSAYWATCH_SPANS_FILE)")


def check_contracts(cfg: Any, where: str) -> None:
    """A monitor config's ``contracts`` section must parse: a typo fails at start."""
    from assaywatch.monitor.config import ConfigError
    from assaywatch.monitor.pipeline.outcome import ContractRules

    if cfg.contracts:
        try:
            ContractRules.from_dict(cfg.contracts)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None


def config_kind_hint(path: str | None, expected: str) -> str:
    """A sentence to append to a config error when ``path`` is the other kind of file:
    the monitor (``monitor``, ``replay``, ``mutate --config``) and the gate (``gate``,
    ``baseline build``, ``plan --config``) read different formats."""
    import dataclasses

    import yaml

    from assaywatch.monitor.config import MonitorConfig
    from assaywatch.monitor.offline.gate import GatePolicy

    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError):
        return ""
    if not isinstance(data, dict):
        return ""
    keys = {str(k) for k in data}
    monitor = {f.name for f in dataclasses.fields(MonitorConfig)}
    gate = {f.name for f in dataclasses.fields(GatePolicy)}
    shared = monitor & gate
    if expected == "gate" and keys - shared and keys - shared <= monitor:
        return (" — this looks like a monitor config (for `assaywatch monitor` and `replay`);"
                " the gate's --config takes gate options: " + ", ".join(sorted(gate)))
    if expected == "monitor" and keys - shared and keys - shared <= gate:
        return (" — this looks like a gate config (for `assaywatch gate`); the monitor's "
                "--config takes sections: " + ", ".join(sorted(monitor)))
    return ""
