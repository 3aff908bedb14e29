"""The ``--loop`` protocol with a looping candidate: ``run <scenario> <index>`` on its
stdin, ``done`` on its stdout after each run's spans are flushed; end of stdin ends it."""

from __future__ import annotations

import subprocess
from typing import IO


def request_run(proc: subprocess.Popen[str], scenario: str, index: int) -> int | None:
    """One run from a looping candidate: None when it answered ``done``, else its exit
    code (it died)."""
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(f"run {scenario or '-'} {index}\n")
        proc.stdin.flush()
    except (BrokenPipeError, OSError):
        return proc.wait()
    out: IO[str] = proc.stdout
    for line in out:
        if line.strip() == "done":
            return None
    return proc.wait()


def close_loop(proc: subprocess.Popen[str]) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        proc.terminate()
