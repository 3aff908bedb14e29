"""The live gate's embedded OTLP/HTTP receiver and the runs it assembles per invocation.

The gate starts an OTLP/HTTP receiver on a free loopback port and points the candidate's
``OTEL_EXPORTER_OTLP_ENDPOINT`` at it. Each invocation of the candidate gets a resource
attribute ``assaywatch.live.invocation=<id>`` through ``OTEL_RESOURCE_ATTRIBUTES`` (merged
with the user's own value), so every span says which invocation produced it, whatever the
concurrency (``--jobs``). The assembler runs with no grace period: the OTLP exporter sends
spans when they end, and an agent's root span ending means its run has ended, so a trace
closes as soon as it is *ready* (see ``monitor.pipeline.assemble``).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from assaywatch.analyzers.model import Run
from assaywatch.monitor.pipeline.assemble import Assembler
from assaywatch.monitor.pipeline.outcome import DEFAULT_SCORE_THRESHOLD, ContractRules
from assaywatch.monitor.receivers.otlp.http_receiver import HttpReceiver
from assaywatch.monitor.receivers.spans import IngestCounters, SpanRecord

#: Resource attribute naming the invocation that produced a span.
INVOCATION_ATTRIBUTE = "assaywatch.live.invocation"
#: Runs whose invocation is unknown (spans without the resource attribute).
UNATTRIBUTED = ""


class LiveCollector:
    """A :class:`~assaywatch.monitor.spans.SpanSink` that assembles runs per invocation.

    Parameters
    ----------
    rules, score_threshold:
        The oracle's contract rules and evaluation threshold (as for the offline gate).
    max_age_s:
        A trace still incomplete this long after its first span is closed anyway.
    """

    def __init__(self, rules: ContractRules | None = None,
                 score_threshold: float = DEFAULT_SCORE_THRESHOLD,
                 max_age_s: float = 600.0) -> None:
        self.counters = IngestCounters()
        self._asm = Assembler(clock=time.monotonic, grace_s=0.0, max_age_s=max_age_s,
                              counters=self.counters, rules=rules,
                              score_threshold=score_threshold)
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._owner: dict[str, str] = {}
        self._runs: dict[str, list[Run]] = defaultdict(list)
        self._receiver: HttpReceiver | None = None
        self.endpoint = ""

    # -- SpanSink ---------------------------------------------------------------------
    def offer(self, spans: list[SpanRecord], receiver: str) -> bool:
        with self._lock:
            for s in spans:
                inv = s.resource.get(INVOCATION_ATTRIBUTE)
                if isinstance(inv, str) and s.trace_id not in self._owner:
                    self._owner[s.trace_id] = inv
            self.counters.add_received(receiver, len(spans))
        self._asm.add(spans)
        self._collect()
        return True

    def _collect(self, flush: bool = False) -> None:
        runs = self._asm.flush() if flush else self._asm.poll()
        if not runs:
            return
        with self._arrived:
            for run in runs:
                self._runs[self._owner.pop(run.trace_id, UNATTRIBUTED)].append(run)
            self._arrived.notify_all()

    # -- runs -------------------------------------------------------------------------
    def take(self, invocation: str, wait_s: float = 0.0, want: int = 1) -> list[Run]:
        """Remove and return the runs of ``invocation``, waiting up to ``wait_s`` for
        ``want`` of them (the exporter's last request may still be in flight)."""
        deadline = time.monotonic() + wait_s
        while True:
            self._collect()
            with self._arrived:
                have = self._runs.get(invocation, [])
                remaining = deadline - time.monotonic()
                if len(have) >= want or remaining <= 0:
                    return self._runs.pop(invocation, [])
                self._arrived.wait(min(remaining, 0.05))

    def take_unattributed(self, flush: bool = False) -> list[Run]:
        """Runs whose spans carried no invocation attribute (flush: close every trace)."""
        self._collect(flush=flush)
        with self._lock:
            return self._runs.pop(UNATTRIBUTED, [])

    # -- lifecycle --------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start the OTLP/HTTP receiver; returns the endpoint URL for the candidate."""
        self._receiver = HttpReceiver(self, self.counters, host=host, port=port)
        bound = self._receiver.start()
        self.endpoint = f"http://{host}:{bound}"
        return self.endpoint

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.stop()
            self._receiver = None

    def __enter__(self) -> LiveCollector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def invocation_env(base: dict[str, str], endpoint: str, invocation: str,
                   scenario: str, index: int) -> dict[str, str]:
    """The candidate's environment: OTLP endpoint and protocol, invocation and scenario."""
    env = dict(base)
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    env.pop("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", None)
    env.pop("OTEL_SDK_DISABLED", None)
    extra = f"{INVOCATION_ATTRIBUTE}={invocation}"
    old = env.get("OTEL_RESOURCE_ATTRIBUTES", "").strip().strip(",")
    env["OTEL_RESOURCE_ATTRIBUTES"] = f"{old},{extra}" if old else extra
    env["ASSAYWATCH_SCENARIO"] = scenario
    env["ASSAYWATCH_RUN_INDEX"] = str(index)
    env["ASSAYWATCH_LIVE"] = "1"
    return env
