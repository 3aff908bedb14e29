"""``assaywatch kafka``: exit 3 without confluent-kafka or without a reachable broker."""

from __future__ import annotations

import subprocess
import sys
import time

CLI = [sys.executable, "-m", "assaywatch.monitor.commands.cli", "kafka"]


def test_unreachable_broker_exits_3_after_the_bounded_wait() -> None:
    for stage in ("assemble", "detect"):
        t0 = time.monotonic()
        res = subprocess.run([*CLI, stage, "--bootstrap", "127.0.0.1:1",
                              "--connect-timeout", "1.5"], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 3, res.stderr
        assert "no Kafka broker answered at 127.0.0.1:1 within 1.5 s" in res.stderr
        assert "Traceback" not in res.stderr
        assert time.monotonic() - t0 < 30


def test_missing_confluent_kafka_exits_3_with_the_install_hint() -> None:
    code = ("import sys; sys.modules['confluent_kafka'] = None; "
            "from assaywatch.monitor.commands.cli import main; "
            "sys.exit(main(['kafka', 'detect', '--bootstrap', '127.0.0.1:1']))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 3, res.stderr
    assert "pip install 'assaywatch[kafka]'" in res.stderr


def test_bad_config_exits_3(tmp_path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("kafka:\n  partitions: 0\n")
    res = subprocess.run([*CLI, "detect", "--config", str(cfg)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 3 and "partitions" in res.stderr, res.stderr
