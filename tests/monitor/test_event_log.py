"""The event log survives a torn last line (a kill -9 inside an append) and garbage lines."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from assaywatch.monitor.exporters.events import EVENTS_NAME, EventLog

FRAGMENT = '{"event": "ala'


def test_a_torn_last_line_is_moved_aside_and_the_next_append_is_whole(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = EventLog(tmp_path)
    first.append({"event": "alarm", "n": 1})
    first.append({"event": "rebaseline", "n": 2})
    with open(first.path, "a", encoding="utf-8") as fh:
        fh.write(FRAGMENT)  # the process died inside the third append
    with caplog.at_level(logging.WARNING, logger="assaywatch.monitor.exporters.events"):
        after = EventLog(tmp_path)
    assert "torn" in caplog.text and str(len(FRAGMENT)) in caplog.text
    assert after.torn_bytes == len(FRAGMENT)
    after.append({"event": "alarm", "n": 3})
    assert after.read() == [{"event": "alarm", "n": 1}, {"event": "rebaseline", "n": 2},
                            {"event": "alarm", "n": 3}]
    assert after.unreadable_lines == 0
    assert after.torn_path == tmp_path / (EVENTS_NAME + ".torn")
    assert after.torn_path.read_text(encoding="utf-8") == FRAGMENT + "\n"
    assert after.path.read_text(encoding="utf-8").endswith('"n": 3}\n')


def test_a_log_of_only_a_torn_line_is_emptied_and_a_whole_log_left_alone(tmp_path: Path) -> None:
    (tmp_path / EVENTS_NAME).write_text(FRAGMENT, encoding="utf-8")
    log = EventLog(tmp_path)
    assert log.path.read_bytes() == b"" and log.read() == []
    log.append({"n": 1})
    again = EventLog(tmp_path)
    assert again.torn_bytes == 0 and again.read() == [{"n": 1}]
    assert again.torn_path.read_text(encoding="utf-8") == FRAGMENT + "\n"


def test_an_append_that_failed_halfway_is_repaired_by_the_next(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    log.append({"n": 1})
    log._check_tail = True  # what a failed append (ENOSPC after a partial write) leaves
    with open(log.path, "a", encoding="utf-8") as fh:
        fh.write('{"n": ')
    log.append({"n": 2})
    assert log.read() == [{"n": 1}, {"n": 2}]
    assert log.torn_path.read_text(encoding="utf-8") == '{"n": \n'


def test_garbage_lines_are_skipped_and_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = EventLog(tmp_path)
    log.append({"n": 1})
    with open(log.path, "ab") as fh:
        fh.write(b'{"n": 2, "cut\n')  # not JSON
        fh.write(b"\xff\xfe not utf-8\n")
        fh.write(b"[1, 2]\n")  # JSON, not a record
        fh.write(b"\n")  # blank: not counted
    log.append({"n": 3})
    with caplog.at_level(logging.WARNING, logger="assaywatch.monitor.exporters.events"):
        assert log.read() == [{"n": 1}, {"n": 3}]
    assert log.unreadable_lines == 3
    for number in (2, 3, 4):
        assert f"line {number} " in caplog.text
    log.path.write_text('{"n": 1}\n', encoding="utf-8")
    assert log.read() == [{"n": 1}] and log.unreadable_lines == 0  # counts the last read


WRITER = textwrap.dedent("""
    import sys
    from assaywatch.monitor.exporters.events import EventLog

    log = EventLog(sys.argv[1])
    i = 0
    while True:
        size = (0, 100, 100_000, 4_000_000)[i % 4]  # large ones may be cut by the kill
        log.append({"event": "alarm", "i": i, "size": size, "pad": "x" * size})
        i += 1
""")


def test_a_writer_killed_at_random_moments_never_breaks_the_log(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    path = tmp_path / EVENTS_NAME
    for _ in range(5):  # a kill inside a 4 MB write tears it now and then
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)],
                                cwd=Path(__file__).resolve().parents[2])
        try:
            start = path.stat().st_size if path.exists() else 0
            deadline = time.monotonic() + 30
            while (not path.exists() or path.stat().st_size <= start) \
                    and time.monotonic() < deadline:
                assert proc.poll() is None, "the writer died on its own"
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.4))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        log = EventLog(tmp_path)
        log.append({"event": "after", "i": -1, "size": 0, "pad": ""})
        records = log.read()
        assert log.unreadable_lines == 0
        assert records[-1]["event"] == "after"
        for record in records:
            assert isinstance(record, dict) and set(record) == {"event", "i", "size", "pad"}
            assert len(record["pad"]) == record["size"]
        assert path.read_bytes().endswith(b"\n")
