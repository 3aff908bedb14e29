"""Static checks run with the tests, so README's one test command covers them: ruff over
the whole tree (with the bare-name import ban, TID251) and mypy --strict on analyzers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff")
    assert ruff, "ruff is part of the [dev] extra: pip install -e '.[dev]'"
    res = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_bare_name_import_is_banned(tmp_path: Path) -> None:
    ruff = shutil.which("ruff")
    assert ruff
    bad = tmp_path / "bad.py"
    bad.write_text("import monitor\nfrom analyzers import model\n")
    res = subprocess.run([ruff, "check", "--no-cache", "--config",
                          str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True)
    assert res.returncode != 0 and "TID251" in res.stdout


@pytest.mark.slow
def test_mypy_strict_on_analyzers() -> None:
    res = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "analyzers"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
