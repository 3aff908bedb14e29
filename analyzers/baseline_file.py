"""The baseline file: several streams' frozen baselines in one JSON document, as written
by ``assaywatch baseline build`` and read by the monitor and the gate."""

from __future__ import annotations

import json
from collections.abc import Sequence

from assaywatch.analyzers.baseline import SCHEMA_VERSION, Baseline
from assaywatch.analyzers.model import StreamKey


def baselines_to_json(baselines: Sequence[Baseline]) -> str:
    """A multi-stream baseline file: ``{"schema_version": 1, "baselines": [...]}``."""
    return json.dumps(
        {"schema_version": SCHEMA_VERSION, "baselines": [b.to_dict() for b in baselines]},
        indent=1,
    )


def baselines_from_json(text: str, where: str = "baseline file") -> list[Baseline]:
    """Inverse of :func:`baselines_to_json`; also accepts a single baseline object.

    Raises
    ------
    ValueError
        On invalid JSON, an unsupported schema version, or two baselines for one stream.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected a JSON object with a 'baselines' list")
    if "baselines" not in doc:
        return [Baseline.from_dict(doc, where)]
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{where}: file schema_version {doc.get('schema_version')!r} is not supported "
            f"(this assaywatch reads version {SCHEMA_VERSION}); rebuild it with "
            "`assaywatch baseline build` or upgrade assaywatch"
        )
    out = [Baseline.from_dict(b, f"{where}, baselines[{i}]")
           for i, b in enumerate(doc["baselines"])]
    seen: dict[StreamKey, int] = {}
    for i, b in enumerate(out):
        if b.key in seen:
            raise ValueError(
                f"{where}: baselines[{seen[b.key]}] and baselines[{i}] are both for stream "
                f"{b.key}; keep one baseline per stream"
            )
        seen[b.key] = i
    return out
