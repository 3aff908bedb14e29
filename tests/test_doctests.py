"""The seeded examples in the statistics' docstrings run and give what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import assaywatch.analyzers


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(assaywatch.analyzers.__path__,
                                                        "assaywatch.analyzers."))


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest example(s) failed in {name}"
