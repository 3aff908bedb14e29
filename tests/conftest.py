"""Suite-wide collection rule for the fresh-clone check (tests/e2e/test_fresh_clone.py).

That check runs README's test command inside a fresh clone, i.e. the whole suite a second
time. There (``ASSAYWATCH_FRESH_CLONE_INNER=1``) the tests marked ``e2e`` or ``slow`` are
skipped: the outer run has just run them on the same commit, and the inner run's purpose
is to show that the command installs and runs the suite from a clone."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("ASSAYWATCH_FRESH_CLONE_INNER") != "1":
        return
    skip = pytest.mark.skip(reason="inside the fresh-clone check: the outer run covers the "
                                   "end-to-end and slow tests")
    for item in items:
        if "e2e" in item.keywords or "slow" in item.keywords:
            item.add_marker(skip)
