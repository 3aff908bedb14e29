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


def load_runs(paths: Sequence[str], *, strict: bool, policy: Any = None) -> tuple[list[Any], Any]:
    """Runs of span files; a strict-mode read error becomes a usage error (exit 3)."""
    from assaywatch.monitor.offline.load import load_runs as _load
    from assaywatch.monitor.pipeline.outcome import ContractRules
    from assaywatch.monitor.receivers.files.errors import SpanFileError

    rules = None
    threshold = 0.5
    if policy is not None:
        threshold = policy.evaluation_threshold
        if policy.contracts:
            try:
                rules = ContractRules.from_dict(policy.contracts)
            except ValueError as exc:
                raise usage_error(f"contracts: {exc}") from None
    try:
        return _load(paths, strict=strict, rules=rules, score_threshold=threshold)
    except SpanFileError as exc:
        raise usage_error(f"{exc} (use without --strict to skip bad records)") from None
    except OSError as exc:
        raise usage_error(f"cannot read {exc.filename}: {exc.strerror}") from None


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
