"""One real Kafka broker (tests/infra/kafka.py) for the module's tests; each test uses its
own topics and groups."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("confluent_kafka", reason="pip install 'assaywatch[kafka]'")


@pytest.fixture(scope="session")
def broker() -> Iterator[Any]:
    from tests.infra.kafka import kafka_broker

    t0 = time.monotonic()
    with kafka_broker(overrides={"group.initial.rebalance.delay.ms": 0}) as kafka:
        print(f"broker ready in {time.monotonic() - t0:.1f} s at {kafka.bootstrap}")
        yield kafka
