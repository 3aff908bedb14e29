"""The distribution ships every sub-package, and the instrumentation path stays light."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"instrumentation": "assaywatch/instrumentation", "monitor": "assaywatch/monitor",
           "analyzers": "assaywatch/analyzers"}


def _expected_packages() -> set[str]:
    out = {"assaywatch"}
    for folder, dest in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if rel.parts[:1] == ("root",):
                continue
            out.add("/".join((dest, *rel.parts)))
    return out


@pytest.mark.slow
def test_wheel_ships_every_subpackage(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    wheel = next(tmp_path.glob("assaywatch-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    missing = _expected_packages() - shipped
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert "assaywatch/auto.py" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "assaywatch = assaywatch.monitor.commands.cli:main" in text
    assert "[opentelemetry_instrumentor]" in text


def test_instrumentation_import_loads_neither_monitor_nor_analyzers() -> None:
    code = ("import sys, assaywatch, assaywatch.instrumentation; "
            "bad = [m for m in sys.modules if m.startswith(('assaywatch.monitor', "
            "'assaywatch.analyzers', 'numpy', 'scipy', 'river', 'grpc'))]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "", f"importing the instrumentation loaded: {out}"


def test_cli_version_and_help() -> None:
    import assaywatch

    out = subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"assaywatch {assaywatch.__version__}"
    helptext = subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "--help"],
                              capture_output=True, text=True, check=True).stdout
    assert "monitor" in helptext


def test_unknown_command_is_a_usage_error() -> None:
    res = subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli",
                          "no-such-command"],
                         capture_output=True, text=True)
    assert res.returncode == 3
    assert "invalid choice" in res.stderr and "Traceback" not in res.stderr
