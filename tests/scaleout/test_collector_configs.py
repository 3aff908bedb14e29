"""Every Collector configuration the project ships loads in the real Collector.

``assaywatch-otelcol validate`` (deploy/collector, the project's distribution: the same
receivers, processors and exporters as the contrib image the deploy files name) parses each
file, resolves its components and checks their settings. It caught the load-balancing
topology's DNS resolver port written as an integer, which the exporter refuses: nothing
else had loaded that file while the distribution had no load-balancing exporter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.otelcol import CollectorError, otelcol_binary, validate

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted([*(ROOT / "deploy" / "collector").glob("*.yaml"),
                  *(ROOT / "deploy" / "collector" / "pipelines").glob("*.yaml"),
                  ROOT / "deploy" / "kafka" / "collector.yaml",
                  ROOT / "deploy" / "record" / "collector-fileexporter.yaml"])


def test_the_shipped_configurations_are_the_ones_listed() -> None:
    # the three topologies, the three test pipelines, the Kafka and the recording Collector
    assert len(CONFIGS) == 8, [p.name for p in CONFIGS]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_real_collector_loads_the_configuration(config: Path) -> None:
    try:
        otelcol_binary()
    except CollectorError as exc:
        pytest.skip(str(exc))
    validate(config)
