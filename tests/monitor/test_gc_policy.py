"""The monitor process's garbage-collector policy (service/gc_policy.py): what exists at
start is frozen out of every collection, the thresholds are raised, and reference cycles
are still collected. Its effect on ingestion is measured by ``bench_freeze``."""

from __future__ import annotations

import gc
import weakref

from assaywatch.monitor.service import gc_policy


class _Node:
    pass


def test_tune_freezes_what_exists_and_raises_the_thresholds() -> None:
    before = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    try:
        assert gc_policy.tune() == before
        assert gc.get_threshold() == (gc_policy.GEN0, gc_policy.GEN1, gc_policy.GEN2)
        # the modules, functions and classes imported so far: thousands of objects
        assert gc.get_freeze_count() > frozen_before + 1_000
        node = _Node()
        node.me = node  # type: ignore[attr-defined]  # a cycle made after the freeze
        ref = weakref.ref(node)
        del node
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
