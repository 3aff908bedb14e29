"""The demo's terminal view: a rich live display on a terminal, plain lines otherwise.

On a terminal the display is rebuilt by rich's refresh thread from the monitor's current
state (under the pipeline lock, as the /metrics collector reads it): two progress bars
(runs sent by the agent, runs assayed by the monitor), the phase (learning, monitoring,
regression injected), and one row per detector with its statistic, its alarm threshold, a
bar of how close the statistic is to that threshold, its state and the run at which its
alarm first fired. Without a terminal (CI, a pipe) it prints one line per event instead:
baseline frozen, regression injected, each alarm onset, progress every 100 runs.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from assaywatch.analyzers.model import StreamKey
from assaywatch.monitor.demo.agent import AGENT, SCENARIO, VERSION
from assaywatch.monitor.engine.streams import _ARL_SHARES, DETECTORS, recent_pass_rate

KEY = StreamKey(AGENT, VERSION, SCENARIO)

#: What each detector watches, in a few words (the README's "how it decides" says more).
WATCHES = {
    "sprt": "pass rate (sequential test)",
    "cusum_pass_rate": "pass rate (CUSUM)",
    "cusum_fingerprint": "behaviour: tools, steps, cost",
    "hotelling": "behaviour, windowed T^2",
}


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _bar(fraction: float | None, width: int = 10) -> Text:
    """How far the statistic has come towards its threshold (1 = alarm)."""
    if fraction is None or not math.isfinite(fraction):
        return Text("-")
    f = min(max(fraction, 0.0), 1.0)
    full = round(f * width)
    style = "red" if fraction >= 1 else "yellow" if fraction >= 0.6 else "green"
    return Text("█" * full, style=style) + Text("·" * (width - full), style="dim")


class DetectorRow:
    """One detector's display values."""

    def __init__(self, name: str, statistic: str, threshold: str, fraction: float | None,
                 state: str, first_alarm: int | None) -> None:
        self.name = name
        self.statistic = statistic
        self.threshold = threshold
        self.fraction = fraction
        self.state = state
        self.first_alarm = first_alarm


class DemoView:
    """Progress, phase and detector table of one demo; see the module docstring."""

    def __init__(self, monitor: Any, args: argparse.Namespace, console: Console) -> None:
        self.mon = monitor
        self.args = args
        self.console = console
        self.sent = 0
        self.injected_at: int | None = None
        self.live: Live | None = None
        self._announced: set[tuple[str, int]] = set()
        self._baseline_announced = False
        self._last_progress = 0
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), console=console)
        self._sent_task = self.progress.add_task("runs sent    ", total=args.runs)
        self._seen_task = self.progress.add_task("runs assayed ", total=args.runs)

    # -- state -----------------------------------------------------------------------
    def _stream(self) -> Any:
        return self.mon.engine.stream(KEY)

    def processed(self) -> int:
        with self.mon.pipeline.lock:
            st = self._stream()
            return 0 if st is None else int(st.n_runs)

    def first_alarms(self) -> dict[str, int]:
        """Detector -> stream run (1-based, baseline runs included) of its first onset."""
        out: dict[str, int] = {}
        for ev in list(self.mon.alarm_log):
            if ev.key == KEY and ev.detector not in out:
                out[ev.detector] = ev.stream_run
        return out

    def rows(self) -> list[DetectorRow]:
        with self.mon.pipeline.lock:
            st = self._stream()
            if st is None or st.baseline is None:
                return []
            cfg = self.mon.engine.config
            first = self.first_alarms()
            out = []
            for name in DETECTORS:
                if name not in cfg.detectors:
                    continue
                stat, thr, frac = self._statistic(name, st, cfg)
                state = "ALARM" if st.alarm_active(name, cfg.alarm_hold_runs) else "ok"
                out.append(DetectorRow(name, stat, thr, frac, state, first.get(name)))
            return out

    @staticmethod
    def _statistic(name: str, st: Any, cfg: Any) -> tuple[str, str, float | None]:
        watch = st.watches.get(name)  # the pass-rate and fingerprint CUSUMs
        if name == "sprt" and st.sprt is not None:
            s = st.sprt
            # Fraction of the way from the Pass boundary a to the Fail boundary b.
            span = s.upper - s.lower
            frac = (s.llr - s.lower) / span if span > 0 else None
            return f"LLR {s.llr:+.2f}", f"{s.lower:.2f}..{s.upper:.2f}", frac
        if watch is not None:
            c = watch.detector
            stat, thr = f"{_num(c.statistic, '.2f')}", f"h {_num(c.threshold, '.2f')}"
            frac = c.statistic / c.threshold if c.threshold > 0 else None
            return stat, thr, frac
        if name == "hotelling":
            # The engine's per-test alpha: one test every `hotelling_every` runs keeps the
            # Hotelling share of the ARL0 target.
            alpha = min(0.05, cfg.hotelling_every / (cfg.arl0 * _ARL_SHARES))
            p = st.hotelling_p
            frac = None
            if p is not None:
                frac = math.log10(max(p, 1e-300)) / math.log10(alpha)
            return f"p {_num(p, '.2g')}", f"p < {alpha:.1g}", frac
        return "-", "-", None

    # -- rendering -------------------------------------------------------------------
    def _phase(self) -> str:
        with self.mon.pipeline.lock:
            st = self._stream()
            learn = self.mon.engine.config.learn_runs
            if st is None or st.baseline is None:
                seen = 0 if st is None else st.n_runs
                phase = f"learning the baseline: {seen}/{learn} runs"
            else:
                phase = (f"monitoring; baseline {st.baseline.n_runs} runs, pass rate "
                         f"{st.baseline.pass_rate:.3f}")
        if self.injected_at is not None:
            phase += f"; '{self.args.regression}' injected after run {self.args.at}"
        return phase

    def _table(self) -> Table:
        with self.mon.pipeline.lock:
            st = self._stream()
            recent = None if st is None else recent_pass_rate(st)
            verdicts = "-" if st is None else "  ".join(
                f"{k} {v or '-'}" for k, v in (("pass_rate", st.pass_rate_verdict),
                                               ("fingerprint", st.fingerprint_verdict),
                                               ("sprt", st.sprt_verdict)))
        t = Table(title=f"{KEY}: {self._phase()}", title_justify="left",
                  caption=f"recent pass rate {_num(None if recent is None else recent[0])}"
                          f"   verdicts: {verdicts}", caption_justify="left", expand=False,
                  box=box.SIMPLE_HEAD, pad_edge=False)
        # "watches" only where it fits: the table stays readable on an 80-column terminal
        wide = self.console.width >= 124
        cols = ["detector", "watches", "statistic", "threshold", "level", "state",
                "first alarm"]
        if not wide:
            cols.remove("watches")
        for col in cols:
            t.add_column(col, no_wrap=True)
        rows = self.rows()
        if not rows:
            t.add_row("(detectors start", "when the baseline", "is frozen)",
                      *[""] * (len(cols) - 3))
        for r in rows:
            at = "-" if r.first_alarm is None else f"{r.first_alarm}" + (
                f" (+{r.first_alarm - self.args.at})" if r.first_alarm > self.args.at else
                " (false)")
            cells: list[RenderableType] = [r.name, r.statistic, r.threshold, _bar(r.fraction),
                                           r.state, at]
            if wide:
                cells.insert(1, WATCHES.get(r.name, ""))
            t.add_row(*cells, style="bold red" if r.state == "ALARM" else None)
        return t

    def __rich__(self) -> RenderableType:
        self._update_progress()
        return Group(self.progress, self._table())

    def __enter__(self) -> DemoView:
        if self.console.is_terminal:
            self.live = Live(self, console=self.console, refresh_per_second=6,
                             transient=False, redirect_stderr=True, redirect_stdout=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.__exit__(*exc)
            self.live = None

    def _update_progress(self) -> None:
        self.progress.update(self._sent_task, completed=self.sent)
        self.progress.update(self._seen_task, completed=self.processed())

    def regression_injected(self, run: int) -> None:
        self.injected_at = run
        if self.live is None:
            print(f"run {run}: regression '{self.args.regression}' injected", flush=True)

    def refresh(self) -> None:
        """Called by the demo loop; on a terminal rich's own thread redraws."""
        if self.live is not None:
            return
        seen = self.processed()
        with self.mon.pipeline.lock:
            st = self._stream()
            base = None if st is None else st.baseline
        if base is not None and not self._baseline_announced:
            self._baseline_announced = True
            print(f"baseline frozen after {base.n_runs} runs (pass rate "
                  f"{base.pass_rate:.3f}); detectors running", flush=True)
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
        out = self.console.print if self.console.is_terminal else print
        lines = ["", "interrupted: partial summary" if interrupted else "summary",
                 f"  runs assayed: {self.processed()} of {self.args.runs}; regression "
                 f"'{self.args.regression}' injected after run {at}"]
        if self.injected_at is None:
            lines[-1] += " (not reached)"
        if not first:
            lines.append("  no alarm fired" + (" (as expected: nothing changed)"
                                               if self.args.regression == "none" else ""))
        for det, run in sorted(first.items(), key=lambda kv: kv[1]):
            delay = run - at
            when = (f"{delay} runs into the regression" if delay > 0 else
                    "before the regression (a false alarm)")
            lines.append(f"  alarm {det}: first fired at run {run} ({when})")
        lines += [
            "next steps:",
            "  1. point a real agent at a monitor: run `assaywatch monitor`, and make",
            "     `import assaywatch.auto` the first line of the agent (it exports to",
            "     127.0.0.1:4317 unless OTEL_EXPORTER_OTLP_ENDPOINT says otherwise)",
            "  2. open the dashboards: `assaywatch dashboards export DIR`",
            "     (dashboards/README.md says how to load them)",
            "  3. gate a deploy on recorded spans: `assaywatch gate --help`",
        ]
        for line in lines:
            if out is print:
                print(line, flush=True)
            else:
                out(line, highlight=False, markup=False)
