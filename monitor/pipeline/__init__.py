"""Spans to runs: the normalizer, the run assembler and the outcome oracle.

``classify`` (normalize.py, key tables in dialects.py) turns one span of any dialect into
content-free facts; ``Assembler`` (assemble.py) groups spans by trace and closes traces;
``build_runs`` (runs.py) splits a closed trace into runs; ``decide_outcome`` (outcome.py)
judges each run.
"""

from __future__ import annotations

from assaywatch.monitor.pipeline.assemble import Assembler, assemble_all
from assaywatch.monitor.pipeline.normalize import Kind, NormalizedSpan, classify
from assaywatch.monitor.pipeline.outcome import (
    ContractRules,
    Evaluation,
    contract_violations,
    decide_outcome,
    judge_evaluation,
)

__all__ = [
    "Assembler",
    "ContractRules",
    "Evaluation",
    "Kind",
    "NormalizedSpan",
    "assemble_all",
    "classify",
    "contract_violations",
    "decide_outcome",
    "judge_evaluation",
]
