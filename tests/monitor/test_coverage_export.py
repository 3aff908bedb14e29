"""The coverage gauge exports only the dimensions that were measured.

A stream whose baseline learned its tools from the runs (no inventory), with no models or
boundaries configured, has nothing to measure tool, model or boundary coverage against:
exporting 1.0 for them would read "fully covered". Path and state coverage are always
measured; ``overall`` is the geometric mean of the exported dimensions."""

from __future__ import annotations

import math

import numpy as np
from prometheus_client import CollectorRegistry

from assaywatch.analyzers.model import TOOL_INVENTORY_ATTRIBUTE, StreamKey
from assaywatch.monitor.config import DetectorConfig
from assaywatch.monitor.engine.engine import Engine
from assaywatch.monitor.exporters.prometheus import MonitorCollector
from assaywatch.monitor.receivers.spans import IngestCounters
from tests.analyzers.simagent import simulate_runs

KEY = StreamKey("support-agent", "1.0", "refund")
LABELS = {"agent": "support-agent", "version": "1.0", "scenario": "refund"}


def test_only_measured_coverage_dimensions_are_exported() -> None:
    engine = Engine(DetectorConfig(learn_runs=60, hotelling_window=40, hotelling_every=20))
    for run in simulate_runs(100, np.random.default_rng(3), key=KEY,
                             tool_weights={"search": 0.6, "lookup": 0.4}):
        engine.process(run)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(engine, IngestCounters()))

    def ratio(dimension: str) -> float | None:
        return registry.get_sample_value("assaywatch_coverage_ratio",
                                         {**LABELS, "dimension": dimension})

    for unmeasured in ("tool", "model", "boundary"):
        assert ratio(unmeasured) is None, unmeasured
    path, state, overall = ratio("path"), ratio("state"), ratio("overall")
    assert path is not None and state is not None and overall is not None
    assert 0 < path <= 1 and 0 < state <= 1
    assert math.isclose(overall, math.sqrt(path * state))


def test_tools_offered_on_the_wire_make_tool_coverage_measured() -> None:
    """Runs whose model calls were offered three tools (the pipeline's tool inventory
    attribute) but used two: the baseline's inventory has three tools from the
    definitions, and the exported tool coverage is 2 of 3."""
    engine = Engine(DetectorConfig(learn_runs=60, hotelling_window=40, hotelling_every=20))
    runs = simulate_runs(100, np.random.default_rng(4), key=KEY,
                         tool_weights={"search": 0.6, "lookup": 0.4})
    for run in runs:
        run.attributes[TOOL_INVENTORY_ATTRIBUTE] = "lookup,refund,search"
        engine.process(run)
    st = engine.stream(KEY)
    assert st is not None and st.baseline is not None
    assert st.baseline.tools == ("lookup", "refund", "search")
    assert st.baseline.tool_inventory_source == "definitions"
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(engine, IngestCounters()))
    tool = registry.get_sample_value("assaywatch_coverage_ratio",
                                     {**LABELS, "dimension": "tool"})
    assert tool is not None and math.isclose(tool, 2 / 3)
