"""Replay orders its runs (end time, then run id) with a bounded number in memory: past
``SORT_RUNS_IN_MEMORY`` they wait in sorted chunks on disk, merged when read. The order is
the one a stable sort of every run in memory gives, and the runs come back equal."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from assaywatch.analyzers.model import Run
from assaywatch.monitor.engine.streams import close_order
from assaywatch.monitor.offline import load
from assaywatch.monitor.offline.load import RunSorter, load_runs
from assaywatch.monitor.receivers.files import write_otlp_json_lines
from tests.e2e.otel_agent import AgentBehaviour, sdk_runs
from tests.scaleout.runs_fixture import recorded_runs


def shuffled_with_ties(seed: int) -> list[Run]:
    """The fixture's 360 runs in random order, plus 40 copies that tie with a run on
    (end time, run id) but differ in another field: a stable order keeps them after it."""
    rng = random.Random(seed)
    runs = list(recorded_runs())
    ties = [dataclasses.replace(r, output_length=r.output_length + 1)
            for r in rng.sample(runs, 40)]
    runs += ties
    rng.shuffle(runs)
    return runs


@pytest.mark.parametrize("in_memory, fan_in, spilled", [
    (7, 3, 396),  # every add of 9 is written: 44 chunks, the last 4 runs stay in memory
    (50, 2, 378),  # a chunk every 6 adds (54 runs): 7 chunks, 22 runs stay
    (1_000, 16, 0),  # all in memory, as before chunks existed
])
def test_the_order_of_a_stable_sort_in_memory(in_memory: int, fan_in: int,
                                              spilled: int) -> None:
    runs = shuffled_with_ties(in_memory)
    sorter = RunSorter(in_memory, fan_in)
    for i in range(0, len(runs), 9):  # added a trace's worth at a time
        sorter.add(runs[i:i + 9])
    assert sorter.count == 400 and sorter.spilled == spilled
    assert list(sorter) == sorted(runs, key=close_order)  # equal runs, in the same order


def test_chunks_are_written_and_merged_by_levels() -> None:
    runs = shuffled_with_ties(3)
    sorter = RunSorter(10, 3)
    sorter.add(runs)  # one chunk of all 400 (a batch is never split)
    assert sorter.spilled == 400 and len(sorter._chunks) == 1  # noqa: SLF001
    sorter = RunSorter(10, 3)
    for i in range(0, 300, 10):  # 30 chunks of 10: every 3 of a level become one
        sorter.add(runs[i:i + 10])
    levels = [lv for lv, _ in sorter._chunks]  # noqa: SLF001
    # 30 = 1*27 + 0*9 + 1*3 + 0*1 in base 3: one chunk of level 3, one of level 1
    assert levels == [3, 1]
    sorter.add(runs[300:305])  # kept in memory, below the limit
    assert list(sorter) == sorted(runs[:305], key=close_order)


def test_runs_no_chunk_line_holds_are_ordered_in_memory() -> None:
    runs = list(recorded_runs())[:30]
    step = dataclasses.replace(runs[5].steps[0], cost_usd=float("inf"))  # no JSON for inf
    runs[5] = dataclasses.replace(runs[5], steps=(step, *runs[5].steps[1:]))
    runs[9] = dataclasses.replace(runs[9], trace_id="a\tb\nc")  # the chunks' separators
    sorter = RunSorter(4, 2)
    for r in reversed(runs):
        sorter.add([r])
    assert sorter.spilled == 26  # 7 chunks of 4, less the odd runs; 2 stay in memory
    assert list(sorter) == sorted(runs, key=close_order)


def test_replay_loads_the_same_runs_with_chunks_on_disk(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         ) -> None:
    spans = sdk_runs(120, AgentBehaviour(pass_rate=0.8), seed=5, gap_ns=200_000_000)
    path = tmp_path / "spans.jsonl"
    write_otlp_json_lines(str(path), spans)
    in_memory, stats = load_runs([str(path)])
    monkeypatch.setattr(load, "SORT_RUNS_IN_MEMORY", 8)
    monkeypatch.setattr(load, "MERGE_FAN_IN", 2)
    on_disk, stats_disk = load_runs([str(path)])
    assert len(in_memory) == 120 and on_disk == in_memory
    assert stats_disk.to_dict() == stats.to_dict()
