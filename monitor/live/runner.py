"""Run the candidate until the verdict is decided: ``assaywatch gate --run COMMAND``.

Two ways to run COMMAND (a shell command line):

**One run per invocation** (default). COMMAND is started once per wanted run with
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` pointing at the gate's
embedded receiver, ``ASSAYWATCH_SCENARIO`` (the scenario wanted; runs that carry no
scenario of their own are filed under it), ``ASSAYWATCH_RUN_INDEX`` and
``ASSAYWATCH_LIVE=1``. An agent using ``import assaywatch.auto`` needs no change: the SDK
exports its spans when the process exits.

**Looping** (``--loop``). COMMAND is started once per job with ``ASSAYWATCH_LOOP=1`` and
reads requests on stdin, one line per wanted run: ``run <scenario> <index>``. For each it
performs one run, flushes its spans (``trace.get_tracer_provider().force_flush()``) and
prints a line ``done`` on stdout. End of stdin means no more runs are wanted. Process
start-up (imports, model clients) is then paid once, not per run.

Scheduling: scenarios are served round robin among those still undecided, so a slow
scenario does not starve the others; ``--jobs K`` keeps K runs in flight. Runs that finish
after their stream decided are counted as spent but not used. A candidate that exits
non-zero without a run counts as one failed run of its scenario, with the exit code kept
in the report, once the command has produced a run; if its first three invocations all
fail without one, the command itself is broken (not found, wrong directory): the gate
stops with exit 3, "the candidate command failed", its exit status and stderr tail.
Ctrl-C stops dispatching, ends the children and reports what was gathered (undecided
streams are Inconclusive: manual review, exit 2).

**Proxy** (``--proxy-run COMMAND2``, monitor/live/fidelity.py): after each target run the
same worker runs COMMAND2 on the same scenario and index (``ASSAYWATCH_TRIAL_INDEX``, plus
``ASSAYWATCH_PROXY=1``; looping too with ``--loop``), then the extra proxy runs on fresh
indices that the stream's :class:`~assaywatch.monitor.live.fidelity.FidelitySPRT` asks for.
A proxy invocation that exits non-zero without a run counts as a failed proxy run.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import IO

from assaywatch.analyzers.baseline import Baseline
from assaywatch.analyzers.fingerprint import fingerprint
from assaywatch.analyzers.model import Outcome, Run, StreamKey
from assaywatch.monitor.live.fidelity import FidelityConfig, FidelitySPRT
from assaywatch.monitor.live.loop_protocol import close_loop, request_run
from assaywatch.monitor.live.receiver import LiveCollector, invocation_env
from assaywatch.monitor.live.sequential import LiveConfig, StreamTest
from assaywatch.monitor.live.streams import Caps, LiveUsageError, Spend, Stream
from assaywatch.monitor.offline.gate import match_baseline

logger = logging.getLogger(__name__)

#: Error-free invocations in a row without spans, or failed invocations before any run
#: at all, after which the gate gives up (exit 3: an input problem, not a verdict).
MAX_SILENT = 3
#: Seconds to wait for the spans of an invocation that exited cleanly.
SPAN_WAIT_S = 3.0
#: Bytes of a failed invocation's stderr kept for the error message.
STDERR_TAIL_BYTES = 2048


class LiveGate:
    """The live gate loop (module docstring); :meth:`run` returns the streams' state."""

    def __init__(self, baselines: Sequence[Baseline], command: str, scenarios: Sequence[str],
                 config: LiveConfig, caps: Caps, jobs: int = 1, loop: bool = False,
                 collector: LiveCollector | None = None, env: dict[str, str] | None = None,
                 proxy_command: str | None = None, fidelity: FidelityConfig | None = None,
                 ) -> None:
        if jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {jobs}")
        self.command = command
        self.proxy_command = proxy_command
        self.fidelity = fidelity or FidelityConfig()
        self.scenarios = list(scenarios)
        self.config = config
        self.caps = caps
        self.jobs = jobs
        self.loop = loop
        self.collector = collector if collector is not None else LiveCollector()
        self.env = dict(os.environ if env is None else env)
        self.by_key = {b.key: b for b in baselines}
        self.streams: dict[StreamKey, Stream] = {
            b.key: Stream(b, b.key) for b in baselines if b.key.scenario in self.scenarios}
        if not self.streams:
            held = ", ".join(sorted({b.key.scenario or "-" for b in baselines}))
            raise LiveUsageError(
                f"no baseline stream has scenario {', '.join(map(repr, self.scenarios))}; "
                f"the baseline holds {held}")
        self.spend = Spend()
        self._lock = threading.Condition()
        self._rr = itertools.cycle(self.scenarios)
        self._in_flight: dict[str, int] = dict.fromkeys(self.scenarios, 0)
        self._attempts: dict[str, int] = dict.fromkeys(self.scenarios, 0)
        self._silent = 0
        self._stop = False
        self._error: Exception | None = None
        self._procs: set[subprocess.Popen[str]] = set()
        #: each child's stderr goes to a temporary file; the tail of the last failure is
        #: kept for the "the candidate command failed" message
        self._stderr: dict[subprocess.Popen[str], IO[bytes]] = {}
        self._last_failure: tuple[int | None, str] = (None, "")
        self._ids = itertools.count(1)
        self._t0 = time.monotonic()
        self.interrupted = False

    # -- what is still wanted ---------------------------------------------------------
    def _scenario_cap(self, scenario: str) -> int:
        tests = [s.test for s in self.streams.values() if s.key.scenario == scenario and s.test]
        cap = max((t.n_plan for t in tests), default=self.config.n_max)
        return min(cap, self.config.n_max)

    def _scenario_done(self, scenario: str) -> bool:
        mine = [s for s in self.streams.values() if s.key.scenario == scenario]
        started = [s for s in mine if s.test is not None]
        if started and all(s.test is not None and s.test.done for s in started):
            return True
        return self._attempts[scenario] >= self._scenario_cap(scenario)

    def _global_stop(self) -> str:
        if self._stop:
            return "interrupted" if self.interrupted else "stopped"
        c = self.caps
        if c.max_seconds is not None and time.monotonic() - self._t0 >= c.max_seconds:
            return f"--max-seconds {c.max_seconds:g} reached"
        if c.max_cost_usd is not None and (
                self.spend.cost_usd + self.spend.proxy_cost_usd >= c.max_cost_usd):
            return f"--max-cost-usd {c.max_cost_usd:g} reached"
        return ""

    def _next(self) -> str | None:
        """A scenario to run now, or None (nothing wanted now); caller holds the lock."""
        if self._error is not None:
            return None
        why = self._global_stop()
        if why:
            self.spend.stopped = self.spend.stopped or why
            return None
        for _ in range(len(self.scenarios)):
            sc = next(self._rr)
            if not self._scenario_done(sc) and (
                    self._attempts[sc] + self._in_flight[sc] < self._scenario_cap(sc)):
                self._in_flight[sc] += 1
                return sc
        return None

    def _finished(self) -> bool:
        return self._error is not None or (not any(self._in_flight.values()) and (
            bool(self._global_stop()) or all(map(self._scenario_done, self.scenarios))))

    # -- recording --------------------------------------------------------------------
    def _stream_for(self, run: Run, scenario: str) -> Stream:
        key = run.key
        if not key.scenario and scenario:
            key = StreamKey(key.agent, key.version, scenario)
            run.key = key
        base = match_baseline(key, self.by_key)
        skey = base.key if base is not None else StreamKey(key.agent, "", key.scenario)
        st = self.streams.get(skey)
        if st is None:
            st = self.streams[skey] = Stream(base, skey)
        if st.test is None and st.baseline is not None:
            st.test = self._new_test(st.baseline, key.version)
        return st

    def _new_test(self, baseline: Baseline, version: str) -> StreamTest:
        test = StreamTest(baseline, self.config, version)
        if self.proxy_command:
            test.sprt = FidelitySPRT(test.sprt, self.fidelity)
        return test

    def _fidelity(self, scenario: str) -> list[FidelitySPRT]:
        return [s.test.sprt for s in self.streams.values() if s.key.scenario == scenario
                and s.test is not None and isinstance(s.test.sprt, FidelitySPRT)]

    def _proxy_wanted(self, scenario: str) -> bool:
        """A paired proxy run is wanted while a stream of the scenario calibrates or uses
        the proxy (or has not started: it will calibrate)."""
        if not self.proxy_command:
            return False
        with self._lock:
            mine = [s for s in self.streams.values() if s.key.scenario == scenario]
            return any(s.test is None or (isinstance(s.test.sprt, FidelitySPRT)
                                          and s.test.sprt.wants_proxy) for s in mine)

    def _reserve_extras(self, scenario: str) -> list[tuple[FidelitySPRT, int]]:
        with self._lock:
            out = []
            for fid in self._fidelity(scenario):
                for _ in range(fid.extras_wanted() - fid.extras_pending):
                    fid.extras_pending += 1
                    fid.extra_index += 1
                    out.append((fid, fid.extra_index))
            return out

    def _proxy_spend(self, runs: list[Run], code: int | None) -> bool | None:
        """Count a proxy invocation; its outcome (crash without a run: failed)."""
        self.spend.proxy_invocations += 1
        for run in runs:
            self.spend.proxy_runs += 1
            self.spend.proxy_tokens += run.total_tokens
            self.spend.proxy_cost_usd += sum(s.cost_usd or 0.0 for s in run.steps)
        if not runs:
            return False if code not in (0, None) and not self.interrupted else None
        return None if runs[0].outcome is Outcome.UNKNOWN else runs[0].outcome is Outcome.PASS

    def _record_extra(self, fid: FidelitySPRT, runs: list[Run], code: int | None) -> None:
        with self._lock:
            passed = self._proxy_spend(runs, code)
            fid.extras_pending -= 1
            if passed is not None:
                fid.add_extra(passed)
            self._lock.notify_all()

    def _record(self, scenario: str, runs: list[Run], exit_code: int | None,
                invocation: str,
                proxy: tuple[list[Run], int | None] | None = None) -> None:
        with self._lock:
            proxy_passed = self._proxy_spend(*proxy) if proxy is not None else None
            self._in_flight[scenario] -= 1
            self._attempts[scenario] += max(1, len(runs))
            self.spend.invocations += 1
            if exit_code != 0 and not self.interrupted:
                self.spend.crashed.append((invocation, exit_code))
                if (not runs and self.spend.runs == 0 and self._error is None
                        and len(self.spend.crashed) >= MAX_SILENT):
                    self._error = self._command_failed()
            if not runs and exit_code == 0:
                self._silent += 1
                if self._silent >= MAX_SILENT and self._error is None:
                    self._error = LiveUsageError(
                        f"{MAX_SILENT} invocations of {self.command!r} exited cleanly without "
                        "sending a run to the gate's OTLP endpoint; does the agent import "
                        "assaywatch.auto (or otherwise honour OTEL_EXPORTER_OTLP_ENDPOINT) "
                        "and end its agent span before exiting?")
            elif runs:
                self._silent = 0
            for run in runs:
                self.spend.runs += 1
                self.spend.tokens += run.total_tokens
                self.spend.cost_usd += sum(s.cost_usd or 0.0 for s in run.steps)
                st = self._stream_for(run, scenario)
                st.runs.append(run)
                if st.test is not None:
                    fp = fingerprint(run, st.baseline.tools) if st.baseline else None
                    known = run.outcome is not Outcome.UNKNOWN
                    fid = st.test.sprt if isinstance(st.test.sprt, FidelitySPRT) else None
                    if fid is not None and proxy is not None:
                        p_runs = proxy[0]
                        fid.stage_pair(proxy_passed, (run, p_runs[0]) if p_runs else None)
                        if p_runs and fp is not None and st.baseline is not None:
                            fid.fingerprints.append((fp, fingerprint(p_runs[0],
                                                                     st.baseline.tools)))
                        proxy = None  # one pair per invocation
                    st.test.update(run.outcome is Outcome.PASS if known else None, fp,
                                   run.scores)
                    if fid is not None:
                        fid.unstage()
            if not runs and exit_code != 0 and not self.interrupted:
                self._crash(scenario)
            self._lock.notify_all()

    def _crash(self, scenario: str) -> None:
        """A crash without a run: one failed run of the scenario's (only) stream."""
        mine = [s for s in self.streams.values()
                if s.key.scenario == scenario and s.baseline is not None]
        started = [s for s in mine if s.test is not None]
        target = started[0] if len(started) == 1 else (mine[0] if len(mine) == 1 else None)
        if target is None or target.baseline is None:
            return
        if target.test is None:
            target.test = self._new_test(target.baseline, "")
        target.crashes += 1
        target.test.update(False, None)

    # -- executing --------------------------------------------------------------------
    def _spawn(self, env: dict[str, str], loop: bool,
               command: str | None = None) -> subprocess.Popen[str]:
        err = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                command or self.command, shell=True, env=env, text=True,
                stdin=subprocess.PIPE if loop else subprocess.DEVNULL,
                stdout=subprocess.PIPE if loop else subprocess.DEVNULL, stderr=err)
        except BaseException:
            err.close()
            raise
        with self._lock:
            self._procs.add(proc)
            self._stderr[proc] = err
        return proc

    def _reap(self, proc: subprocess.Popen[str]) -> int | None:
        try:
            code = proc.wait()
        finally:
            with self._lock:
                self._procs.discard(proc)
                err = self._stderr.pop(proc, None)
        if err is not None:
            with err:
                if code != 0:
                    err.seek(max(0, err.seek(0, os.SEEK_END) - STDERR_TAIL_BYTES))
                    tail = err.read().decode("utf-8", "replace").strip()
                    with self._lock:
                        self._last_failure = (code, tail)
        return code

    def _command_failed(self) -> LiveUsageError:
        code, tail = self._last_failure
        lines = tail.splitlines()[-5:]
        shown = ("; its stderr ends with: " + " | ".join(lines)) if lines else \
            "; it wrote nothing on stderr"
        return LiveUsageError(
            f"the candidate command failed: {len(self.spend.crashed)} invocations of "
            f"{self.command!r} exited with a non-zero status (last: {code}) without "
            f"sending a run{shown}. Check that the command runs from this directory; "
            "this is not a verdict about the agent")

    def _env(self, inv: str, scenario: str, index: int, proxy: bool) -> dict[str, str]:
        env = invocation_env(self.env, self.collector.endpoint, inv, scenario, index)
        env["ASSAYWATCH_TRIAL_INDEX"] = str(index)
        if proxy:
            env["ASSAYWATCH_PROXY"] = "1"
        return env

    def _invoke(self, scenario: str, index: int, proxy: bool,
                procs: dict[bool, tuple[subprocess.Popen[str], str]],
                slot: int) -> tuple[list[Run], int | None, str]:
        """One run of the target (or proxy) command: its runs, exit code, invocation."""
        command = self.proxy_command if proxy else self.command
        assert command is not None
        if not self.loop:
            inv = f"{'p' if proxy else 'i'}{next(self._ids)}"
            code = self._reap(self._spawn(self._env(inv, scenario, index, proxy), False,
                                          command))
            return self.collector.take(inv, wait_s=SPAN_WAIT_S if code == 0 else 0.3), code, inv
        if proxy not in procs or procs[proxy][0].poll() is not None:
            inv = f"w{slot}{'x' if proxy else 'p'}{next(self._ids)}"
            env = self._env(inv, scenario, 0, proxy)
            env["ASSAYWATCH_LOOP"] = "1"
            procs[proxy] = (self._spawn(env, True, command), inv)
        proc, inv = procs[proxy]
        code = request_run(proc, scenario, index)
        if code is not None:  # the looping process died on this request
            self._reap(proc)
            del procs[proxy]
        runs = self.collector.take(inv, wait_s=SPAN_WAIT_S if code is None else 0.3)
        return runs, (0 if code is None else code), inv

    def _worker(self, slot: int) -> None:
        procs: dict[bool, tuple[subprocess.Popen[str], str]] = {}
        try:
            while True:
                with self._lock:
                    sc = self._next()
                    while sc is None and not self._finished():
                        self._lock.wait(0.1)
                        sc = self._next()
                    index = self._attempts[sc] if sc is not None else 0
                if sc is None:
                    return
                runs, code, inv = self._invoke(sc, index, False, procs, slot)
                proxy = None
                if runs and self._proxy_wanted(sc):
                    p_runs, p_code, _ = self._invoke(sc, index, True, procs, slot)
                    proxy = (p_runs, p_code)
                self._record(sc, runs, code, inv, proxy)
                for fid, idx in self._reserve_extras(sc):
                    p_runs, p_code, _ = self._invoke(sc, idx, True, procs, slot)
                    self._record_extra(fid, p_runs, p_code)
        except Exception as exc:  # noqa: BLE001 - reported as the gate's error
            logger.exception("live gate worker %d failed", slot)
            with self._lock:
                self._error = self._error or exc
                self._lock.notify_all()
        finally:
            for proc, _ in procs.values():
                close_loop(proc)
                self._reap(proc)

    def _terminate_children(self) -> None:
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            if p.poll() is None:
                p.terminate()

    def run(self) -> dict[StreamKey, Stream]:
        """Run until every scenario is decided or capped, a budget cap or Ctrl-C."""
        if not self.collector.endpoint:
            self.collector.start()
        workers = [threading.Thread(target=self._worker, args=(i,), daemon=True,
                                    name=f"live-gate-{i}") for i in range(self.jobs)]
        try:
            for w in workers:
                w.start()
            for w in workers:
                while w.is_alive():
                    w.join(0.1)
        except KeyboardInterrupt:
            with self._lock:
                self.interrupted = self._stop = True
                self.spend.stopped = "interrupted (Ctrl-C)"
                self._lock.notify_all()
            self._terminate_children()
            for w in workers:
                w.join(10)
        finally:
            self.spend.unattributed = len(self.collector.take_unattributed(flush=True))
            self.collector.stop()
        if self._error is not None:
            raise self._error
        return self.streams

    @property
    def seconds(self) -> float:
        return time.monotonic() - self._t0
