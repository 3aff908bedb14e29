"""The garbage collector's policy for a long-running monitor process.

CPython's default thresholds (700, 10, 10) suit short scripts. In the monitor, ~100 objects
are made per run assembled, so at 1,000 runs/s the youngest generation is collected ~140
times a second, and the spans of traces still pending (alive for their grace time) survive
into the oldest generation, where they die: full collections then came every few seconds,
each walking every long-lived object (streams, detectors, the evaluation join's digests),
0.25-0.8 s with the whole process stopped (1,000 streams, 2 cores; measured with
``gc.callbacks``: 37 in a 2.5-minute ``bench_freeze``, 6 of at most 0.15 s with this
policy, and ~1.7x the runs ingested per second; monitor/README "Memory and overload").

:func:`tune` (called by ``assaywatch monitor`` and the ``kafka assemble`` / ``kafka detect``
workers as they start) therefore

* moves what exists when it is called (the modules, functions and classes imported, the
  configuration; it is called before any state is restored or received) into the
  permanent generation (``gc.freeze``), so no collection walks it again. Frozen objects
  are still freed by reference counting; only a cycle among them would stay, and these
  live as long as the process anyway;
* raises the youngest generation's threshold to :data:`GEN0` allocations and the others to
  :data:`GEN1` and :data:`GEN2` collections: a pending trace's objects die before their
  first collection instead of being promoted, and a full collection comes rarely.

Reference cycles are still collected, only later; memory held by cyclic garbage between
collections is bounded by the thresholds (tens of thousands of small objects).
"""

from __future__ import annotations

import gc

GEN0 = 50_000
GEN1 = 20
GEN2 = 10


def tune() -> tuple[int, int, int]:
    """Apply the policy to this process; returns the thresholds it replaced."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0, GEN1, GEN2)
    return before  # type: ignore[return-value]
