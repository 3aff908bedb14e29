"""Loader of the conformance corpus: each fixture with the runs a person expects from it.

``load_cases()`` returns one :class:`Case` per ``fixtures/NAME.expected.json`` (the
expectations are written by hand from what ``agents.py`` does, never computed by
assaywatch). :func:`summarize_run` projects a pipeline ``Run`` into the same shape as
:meth:`ExpectedRun.as_dict`, so a test can compare the two as multisets::

    for case in load_cases():
        runs, _ = load_runs([str(case.fixture)])
        assert sorted_dicts(summarize_run(r) for r in runs) == case.expected_dicts()

``python -m tests.conformance.expected`` prints what the current pipeline builds next to
the expectations (a diagnostic, not a test).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FIXTURES", "STEP_KINDS", "Case", "ExpectedRun", "load_cases", "sorted_dicts",
           "summarize_run"]

FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: Step kinds of the expectation files, in order. ``retrieval`` is ``Action.RETRIEVE``
#: ("retrieve") in assaywatch; ``agent`` counts nested agent invocations.
STEP_KINDS = ("llm", "tool", "retrieval", "handoff", "agent", "other")
_ACTION_TO_KIND = {"retrieve": "retrieval"}


@dataclass(frozen=True)
class ExpectedRun:
    agent: str
    version: str
    scenario: str
    steps: dict[str, int]
    tools: tuple[str, ...]
    models: tuple[str, ...]
    input_tokens: int
    output_tokens: int
    outcome: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExpectedRun:
        stream = d["stream"]
        steps = {k: int(d["steps"].get(k, 0)) for k in STEP_KINDS}
        unknown = set(d["steps"]) - set(STEP_KINDS)
        if unknown:
            raise ValueError(f"unknown step kinds {sorted(unknown)}")
        return cls(agent=stream["agent"], version=stream.get("version", ""),
                   scenario=stream.get("scenario", ""), steps=steps,
                   tools=tuple(d.get("tools", ())), models=tuple(sorted(d.get("models", ()))),
                   input_tokens=int(d["input_tokens"]), output_tokens=int(d["output_tokens"]),
                   outcome=d["outcome"])

    def as_dict(self) -> dict[str, Any]:
        """Comparable form; ``tools`` sorted (the call order is not part of the expectation)."""
        return {"agent": self.agent, "version": self.version, "scenario": self.scenario,
                "steps": dict(self.steps), "tools": sorted(self.tools),
                "models": list(self.models), "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "outcome": self.outcome}


@dataclass(frozen=True)
class Case:
    name: str
    fixture: Path
    runs: tuple[ExpectedRun, ...]
    description: str = ""
    comment: str = ""
    recorded_with: dict[str, Any] = field(default_factory=dict)

    def expected_dicts(self) -> list[dict[str, Any]]:
        return sorted_dicts(r.as_dict() for r in self.runs)


def sorted_dicts(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A canonical order for a multiset of run dicts."""
    return sorted(items, key=lambda d: json.dumps(d, sort_keys=True))


def load_cases(folder: Path | str = FIXTURES) -> list[Case]:
    """Every ``*.expected.json`` in ``folder`` with its fixture, sorted by name."""
    cases = []
    for path in sorted(Path(folder).glob("*.expected.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        name = path.name.removesuffix(".expected.json")
        fixture = path.with_name(doc.get("fixture", f"{name}.jsonl"))
        if not fixture.exists():
            raise FileNotFoundError(f"{path.name}: fixture {fixture.name} is missing")
        runs = tuple(ExpectedRun.from_json(r) for r in doc["runs"])
        if doc.get("run_count", len(runs)) != len(runs):
            raise ValueError(f"{path.name}: run_count {doc['run_count']} != {len(runs)} runs")
        cases.append(Case(name=name, fixture=fixture, runs=runs,
                          description=doc.get("description", ""),
                          comment=doc.get("comment", ""),
                          recorded_with=doc.get("recorded_with", {})))
    return cases


def summarize_run(run: Any) -> dict[str, Any]:
    """Project an assaywatch ``Run`` into :meth:`ExpectedRun.as_dict`'s shape.

    Duck-typed (``run.key``, ``run.steps[*].action/tool/input_tokens/output_tokens``,
    ``run.models``, ``run.outcome``) so it survives module moves.
    """
    counts: Counter[str] = Counter()
    for s in run.steps:
        action = str(getattr(s.action, "value", s.action))
        counts[_ACTION_TO_KIND.get(action, action)] += 1
    steps = {k: counts.get(k, 0) for k in STEP_KINDS}
    for k, v in counts.items():  # keep any kind the expectation files do not know
        if k not in steps:
            steps[k] = v
    tools = sorted(s.tool for s in run.steps
                   if str(getattr(s.action, "value", s.action)) == "tool" and s.tool)
    return {"agent": run.key.agent, "version": run.key.version, "scenario": run.key.scenario,
            "steps": steps, "tools": tools, "models": sorted(run.models),
            "input_tokens": sum(s.input_tokens for s in run.steps),
            "output_tokens": sum(s.output_tokens for s in run.steps),
            "outcome": str(getattr(run.outcome, "value", run.outcome))}


def _load_runs(path: Path) -> list[Any]:
    try:
        from assaywatch.monitor.offline.load import load_runs
    except ImportError:  # the restructure may move it
        import importlib

        load_runs = None
        for mod in ("assaywatch.monitor.offline", "assaywatch.monitor.gate.load"):
            try:
                load_runs = importlib.import_module(mod).load_runs
                break
            except (ImportError, AttributeError):
                continue
        if load_runs is None:
            raise
    runs, _stats = load_runs([str(path)])
    return list(runs)


def _diff(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    out = []
    for k in expected:
        if k == "steps":
            for kind in sorted(set(expected["steps"]) | set(actual["steps"])):
                e, a = expected["steps"].get(kind, 0), actual["steps"].get(kind, 0)
                if e != a:
                    out.append(f"steps.{kind}: expected {e}, got {a}")
        elif expected[k] != actual.get(k):
            out.append(f"{k}: expected {expected[k]!r}, got {actual.get(k)!r}")
    return out


def main() -> int:
    """Print the current pipeline's runs against the expectations; exit 0 always."""
    for case in load_cases():
        exp = case.expected_dicts()
        act = sorted_dicts(summarize_run(r) for r in _load_runs(case.fixture))
        status = "OK  " if exp == act else "DIFF"
        print(f"{status} {case.name}: expected {len(exp)} runs, pipeline built {len(act)}")
        if exp == act:
            continue
        if len(exp) != len(act):
            print(f"     run count: expected {len(exp)}, got {len(act)}")
        seen: set[str] = set()
        for e in exp[:1]:
            for a in act:
                for line in _diff(e, a):
                    if line not in seen:
                        seen.add(line)
                        print(f"     {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
