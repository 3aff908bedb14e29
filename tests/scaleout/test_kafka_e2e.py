"""(1) End to end on real parts: agents on the real OTel SDK -> the real Collector
(deploy/collector, its kafka exporter) -> a real Kafka 4.4 broker -> 2 assemblers -> 3
detector workers; the alarms, the final state and every stream's run order equal those of
one single-process replay of the same spans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.scaleout.scenario import assert_equal_to_replay, run_scenario

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_two_assemblers_three_detectors_equal_replay(broker: Any, tmp_path: Path) -> None:
    res = run_scenario(broker, tmp_path, "e2e", n_assemblers=2, n_detectors=3)
    print("timings", res["timings"])
    if any(res["codes"].values()):
        (tmp_path / "workers.log").write_text(res["cluster"].logs())
    assert all(code == 0 for code in res["codes"].values()), (res["codes"], tmp_path)
    assert_equal_to_replay(res)
    # the work was shared: every detector worker checkpointed some partition
    assert len(res["states"]) == 6
    assert res["alarm_duplicates"] == 0
