"""The monitor's configuration: defaults, precedence (flag > env > file > default), and bad
configuration failing at start with a message naming the file, the key and the choices."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from assaywatch.monitor.commands.errors import UsageError
from assaywatch.monitor.commands.monitor import load_config
from assaywatch.monitor.config import (
    DEFAULT_METRICS,
    DEFAULT_OTLP_GRPC,
    ConfigError,
    MonitorConfig,
    iter_options,
    parse_hostport,
)


def _args(**kw: object) -> argparse.Namespace:
    base = {"config": None, "state_dir": None, "baseline": None, "otlp_grpc": None,
            "otlp_http": None, "metrics": None}
    base.update(kw)
    return argparse.Namespace(**base)


def test_defaults_bind_loopback_and_keep_no_state() -> None:
    cfg = MonitorConfig()
    assert cfg.listen.otlp_grpc == DEFAULT_OTLP_GRPC and cfg.listen.metrics == DEFAULT_METRICS
    assert all(v.startswith("127.0.0.1:") for v in (cfg.listen.otlp_grpc, cfg.listen.otlp_http,
                                                    cfg.listen.metrics))
    assert cfg.state_dir == ""
    keys = {k for k, _, _ in iter_options()}
    assert {"detectors.arl0", "assembler.grace_seconds", "limits.max_streams"} <= keys
    assert all(doc for _, _, doc in iter_options()), "every option has its documentation"


def test_flag_beats_env_beats_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "m.yaml"
    f.write_text("listen:\n  metrics: 127.0.0.1:1111\n  otlp_http: 127.0.0.1:2222\n"
                 "detectors:\n  arl0: 5000\n")
    monkeypatch.setenv("ASSAYWATCH_METRICS", "127.0.0.1:3333")
    cfg = load_config(_args(config=str(f), metrics="127.0.0.1:4444"))
    assert cfg.listen.metrics == "127.0.0.1:4444"
    cfg = load_config(_args(config=str(f)))
    assert cfg.listen.metrics == "127.0.0.1:3333"
    assert cfg.listen.otlp_http == "127.0.0.1:2222" and cfg.detectors.arl0 == 5000.0


@pytest.mark.parametrize("text, words", [
    ("detectors:\n  arl_0: 100\n", ["unknown option", "arl_0", "arl0"]),
    ("detectors:\n  alpha: 2\n", ["alpha", "between 0 and 1"]),
    ("detectors:\n  detectors: [sprt, magic]\n", ["magic", "cusum_pass_rate"]),
    ("listen:\n  metrics: localhost\n", ["HOST:PORT"]),
    ("assembler: 3\n", ["assembler must be a mapping"]),
    ("detectors: {learn_runs: many}\n", ["learn_runs must be a int"]),
    ("- a list\n", ["top level must be a mapping"]),
    ("a: [unclosed\n", ["not valid YAML"]),
])
def test_bad_config_is_reported_with_file_and_key(tmp_path: Path, text: str,
                                                  words: list[str]) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        MonitorConfig.load(f)
    msg = str(info.value)
    assert str(f) in msg
    for w in words:
        assert w in msg, msg


def test_bad_config_fails_the_monitor_at_start_without_traceback(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("detectors:\n  arl_0: 100\n")
    res = subprocess.run([sys.executable, "-m", "assaywatch.monitor.commands.cli", "monitor",
                          "--config", str(f), "--metrics", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 3
    assert "arl_0" in res.stderr and "Traceback" not in res.stderr


def test_bad_flag_address_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="HOST:PORT"):
        load_config(_args(otlp_grpc="4317"))
    assert parse_hostport("[::1]:4317") == ("::1", 4317)
