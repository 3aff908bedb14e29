"""A flood straight at the monitor's receivers, no admission proxy in front (issue 15).

The scenario of ``tests/e2e/test_overload.py`` (a Go load generator posting ~53-span
requests back to back from 32 connections, never honouring ``Retry-After``, two Python
gRPC flood processes, a well-behaved agent, a scrape every 0.5 s) for 30 s at the
monitor itself. That test asserts x10 the capacity through the shipped admission proxy;
here the ratio is measured, not claimed: one Python process answers a flood at about its
own capacity, every answer (a refusal included) parsed and written under its interpreter
lock, so the flood waits rather than being refused (monitor/README.md "Memory and
overload"). Printed: the scenario's figures, then a summary table of what held.
Needs the ``go`` command.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.e2e.rawotlp import value
from tests.e2e.test_overload import (
    ALLOWED_ANSWERS,
    GOOD_AGENT,
    RSS_BOUND_MIB,
    TARGET_RATIO,
    run_overload,
)


def main() -> None:
    finalizers: list[Callable[[], object]] = []
    with tempfile.TemporaryDirectory(prefix="assaywatch-overload-") as tmp:
        try:
            m = run_overload(Path(tmp), "monitor", finalizers.append)
        finally:
            for f in finalizers:
                f()
    counted = value(m.samples, "assaywatch_runs_total", agent=GOOD_AGENT)
    rows = [
        ("offered / capacity", f"x{m.ratio:.1f}", f"x{TARGET_RATIO:g} (met only through "
         "the admission proxy)"),
        ("share of answers refused", f"{m.refused_share:.0%}", "-"),
        ("load generator CPU; its connections waiting for answers",
         f"{m.lg_cores:.2f} cores; {m.waiting:.0%}", "the generator is not the limit "
         "below 0.5 core and above 90%"),
        ("monitor CPU during the flood", f"{m.flood_cpu:.2f} cores", "-"),
        ("peak RSS (VmHWM)", f"{m.hwm_mib:.0f} MiB", f"<= {RSS_BOUND_MIB} MiB"),
        ("answers other than 200/OK/503/UNAVAILABLE; refusals without a retry hint",
         f"{sorted(set(m.codes) - ALLOWED_ANSWERS)}; {m.no_hint}", "none; 0"),
        ("/metrics p99; counter regressions",
         f"{m.p99 * 1000:.0f} ms; {len(m.scraper.regressions)}", "< 1000 ms; 0"),
        ("well-behaved agent's runs counted", f"{counted:.0f} of {m.good.runs}", "all"),
        ("fresh run accepted / counted after the load",
         f"{m.accepted_after:.1f} s / "
         f"{'never' if m.counted_after is None else f'{m.counted_after:.1f} s'}",
         "< 5 s / < 10 s"),
        ("dropped spans by reason", str({k: int(v) for k, v in m.dropped.items() if v}),
         "the flood's only: its orphans (no_root_span), its sender quota (sender_quota)"),
        ("monitor exit code", str(m.code), "0"),
    ]
    print("\n| straight at the monitor | measured | goal |\n|---|---|---|")
    for name, got, goal in rows:
        print(f"| {name} | {got} | {goal} |")
