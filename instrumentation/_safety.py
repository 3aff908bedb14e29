"""Failures inside our telemetry never break the agent: log once per site, count always.

The wrapper rule (shared/STYLE.md): an exception from the application is recorded on the
span and re-raised unchanged; an exception raised by *our* telemetry code is caught here,
logged with its traceback the first time a given site fails (later failures of the same
site only count, so a broken exporter cannot flood the agent's logs), and counted in
:func:`telemetry_errors`.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("assaywatch.instrumentation")

_lock = threading.Lock()
_counts: Counter[str] = Counter()


def report(site: str) -> None:
    """Count a telemetry failure at ``site`` and log it the first time.

    Call from inside an ``except`` block so the traceback is logged.
    """
    with _lock:
        _counts[site] += 1
        first = _counts[site] == 1
    if first:
        logger.exception(
            "assaywatch telemetry failed in %s; the agent continues, this span may be "
            "incomplete (further failures here are counted, not logged)",
            site,
        )


@contextmanager
def guarded(site: str) -> Iterator[None]:
    """Run a block of telemetry code, swallowing and reporting any exception it raises."""
    try:
        yield
    except Exception:  # noqa: BLE001 - telemetry must never break the agent
        report(site)


def telemetry_errors() -> dict[str, int]:
    """Telemetry failures so far, by site (a copy)."""
    with _lock:
        return dict(_counts)


def reset_telemetry_errors() -> None:
    """Forget the counts (and log the next failure of each site again). For tests."""
    with _lock:
        _counts.clear()
