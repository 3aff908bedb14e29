"""Suite-wide collection rule for the fresh-clone check (tests/e2e/test_fresh_clone.py).

That check runs README's test command inside a fresh clone, i.e. the whole suite a second
time. There (``ASSAYWATCH_FRESH_CLONE_INNER=1``) every test module is collected (an import
that fails in a clone, a data file missing from it, fails the run), but only the tests
that examine the clone itself run: its docs and packaging (:data:`INNER_MODULES`) and the
compiled decoder that README's command built there. The others are skipped: the outer
run has just run them on the same commit, and CI's outer run is itself README's test
command in a clean checkout. (Running them all again took 405 s of CI's 30 minutes.)"""

from __future__ import annotations

import os

import pytest

#: The test modules the fresh clone runs (paths from the repository root).
INNER_MODULES = frozenset({
    "tests/test_docs.py",
    "tests/test_architecture.py",
    "tests/test_doctests.py",
    "tests/test_packaging.py",
    "tests/monitor/test_native_decode.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("ASSAYWATCH_FRESH_CLONE_INNER") != "1":
        return
    root = config.rootpath
    slow = pytest.mark.skip(reason="inside the fresh-clone check: the outer run covers the "
                                   "end-to-end and slow tests")
    other = pytest.mark.skip(reason="inside the fresh-clone check: the outer run covers it; "
                                    "the clone runs its docs, packaging and native decoder")
    for item in items:
        if "e2e" in item.keywords or "slow" in item.keywords:
            item.add_marker(slow)
        elif item.path.relative_to(root).as_posix() not in INNER_MODULES:
            item.add_marker(other)
