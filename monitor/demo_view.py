"""The demo's terminal view: a rich live table on a terminal, plain lines otherwise."""

from __future__ import annotations

import argparse
import math
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.demo import AGENT, SCENARIO, VERSION
from assaywatch.monitor.engine import DETECTORS, recent_pass_rate

KEY = StreamKey(AGENT, VERSION, SCENARIO)


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


class DemoView:
    def __init__(self, monitor: Any, args: argparse.Namespace, console: Console) -> None:
        self.mon = monitor
        self.args = args
        self.console = console
        self.sent = 0
        self.live: Live | None = None
        self._announced: set[tuple[str, int]] = set()
        self._baseline_announced = False
        self._last_progress = 0
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), console=console)
        self._sent_task = self.progress.add_task("runs sent     ", total=args.runs)
        self._seen_task = self.progress.add_task("runs assayed  ", total=args.runs)

    # -- state -----------------------------------------------------------------------
    def _stream(self) -> Any:
        return self.mon.engine.stream(KEY)

    def processed(self) -> int:
        with self.mon.pipeline.lock:
            st = self._stream()
            return 0 if st is None else int(st.n_runs)

    def first_alarms(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ev in list(self.mon.alarm_log):
            if ev.key == KEY and ev.detector not in out:
                out[ev.detector] = ev.stream_run
        return out

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        with self.mon.pipeline.lock:
            st = self._stream()
            if st is None or st.baseline is None:
                return []
            d = st.detectors
            hold = self.mon.engine.config.alarm_hold_runs
            first = self.first_alarms()
            out = []
            for name in DETECTORS:
                if name == "sprt" and "sprt" in d:
                    stat = f"LLR {_num(d['sprt'].llr, '+.2f')}"
                    thr = f"[{d['sprt'].lower:.2f}, {d['sprt'].upper:.2f}]"
                elif name == "cusum_pass_rate" and name in d:
                    stat, thr = _num(d[name].statistic, ".2f"), _num(d[name].threshold, ".2f")
                elif name == "cusum_fingerprint" and name in d:
                    stat = (f"{_num(d[name].statistic, '.2f')} / MEWMA "
                            f"{_num(d['mewma'].statistic, '.1f')}")
                    thr = f"{_num(d[name].threshold, '.2f')} / {_num(d['mewma'].threshold, '.1f')}"
                elif name == "hotelling":
                    stat, thr = f"p {_num(st.hotelling_p, '.2g')}", "p < alpha/time"
                else:
                    continue
                state = "ALARM" if st.alarm_active(name, hold) else "ok"
                at = str(first[name]) if name in first else "-"
                out.append((name, stat, thr, state, at))
            return out

    # -- rendering -------------------------------------------------------------------
    def _table(self) -> Table:
        with self.mon.pipeline.lock:
            st = self._stream()
            title = "learning baseline..." if st is None or st.baseline is None else (
                f"baseline: {st.baseline.n_runs} runs, pass rate {st.baseline.pass_rate:.3f}")
            recent = None if st is None else recent_pass_rate(st)
            verdicts = "" if st is None else "  ".join(
                f"{k}={v or '-'}" for k, v in (("pass_rate", st.pass_rate_verdict),
                                               ("fingerprint", st.fingerprint_verdict),
                                               ("sprt", st.sprt_verdict)))
        t = Table(title=f"{KEY}  {title}", caption=f"recent pass rate "
                  f"{_num(None if recent is None else recent[0])}   verdicts: {verdicts}")
        for col in ("detector", "statistic", "threshold", "state", "first alarm at run"):
            t.add_column(col)
        for row in self.rows():
            t.add_row(*row, style="bold red" if row[3] == "ALARM" else None)
        return t

    def __enter__(self) -> DemoView:
        if self.console.is_terminal:
            self.live = Live(Group(self.progress, self._table()), console=self.console,
                             refresh_per_second=8, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.update(Group(self.progress, self._table()))
            self.live.__exit__(*exc)

    def refresh(self) -> None:
        seen = self.processed()
        self.progress.update(self._sent_task, completed=self.sent)
        self.progress.update(self._seen_task, completed=seen)
        if self.live is not None:
            self.live.update(Group(self.progress, self._table()))
            return
        st = self._stream()
        if st is not None and st.baseline is not None and not self._baseline_announced:
            self._baseline_announced = True
            print(f"baseline frozen after {st.baseline.n_runs} runs "
                  f"(pass rate {st.baseline.pass_rate:.3f}); detectors running", flush=True)
        for det, at in self.first_alarms().items():
            if (det, at) not in self._announced:
                self._announced.add((det, at))
                print(f"ALARM {det} fired at run {at}", flush=True)
        if seen - self._last_progress >= 100:
            self._last_progress = seen - seen % 100
            print(f"runs assayed: {seen}/{self.args.runs}", flush=True)

    def summary(self, interrupted: bool) -> None:
        first = self.first_alarms()
        at = self.args.at
        print()
        print("interrupted: partial summary" if interrupted else "summary")
        print(f"  runs assayed: {self.processed()} of {self.args.runs}; regression "
              f"'{self.args.regression}' injected after run {at}")
        if not first:
            print("  no alarm fired" + (" (as expected: nothing changed)"
                                        if self.args.regression == "none" else ""))
        for det, run in sorted(first.items(), key=lambda kv: kv[1]):
            delay = run - at
            when = f"{delay} runs after the regression began" if delay > 0 else \
                "before the regression (a false alarm)"
            print(f"  alarm {det}: first fired at run {run} ({when})")
        print("next steps:")
        print("  point a real agent at a monitor: `assaywatch monitor`, then in the agent "
              "`import assaywatch.auto` (OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317)")
        print("  dashboards and alert rules: `assaywatch dashboards export DIR`, see "
              "dashboards/README.md")
