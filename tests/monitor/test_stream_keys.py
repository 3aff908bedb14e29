"""Extra stream key attributes (``streams.key_attributes``): one baseline per model, per
tenant or per prompt version, the values joining the scenario label."""

from __future__ import annotations

import time

from assaywatch.monitor.config import ConfigError, MonitorConfig
from assaywatch.monitor.pipeline.assemble import assemble_all
from assaywatch.monitor.receivers.spans import SpanRecord
from assaywatch.monitor.service.monitor import Monitor
from tests.e2e.rawotlp import OtlpHttp, proto_bytes
from tests.monitor.spanfactory import SpanFactory, tool_agent

KEYS = ("gen_ai.request.model", "app.tenant")


def _run(seed: int, model: str, tenant: str | None) -> list[SpanRecord]:
    spans = SpanFactory(seed=seed).agent_run(tool_agent(model=model), "genai")
    if tenant is not None:
        spans[0].resource["app.tenant"] = tenant  # one resource dict per run here
    return spans


def test_key_attributes_split_the_scenario_by_model_and_tenant() -> None:
    spans = (_run(1, "gpt-4o-mini", "acme") + _run(2, "gpt-4o", "acme")
             + _run(3, "gpt-4o-mini", None))
    keyed = sorted(r.key.scenario for r in assemble_all(spans, key_attributes=KEYS))
    assert keyed == ["booking [gen_ai.request.model=gpt-4o, app.tenant=acme]",
                     "booking [gen_ai.request.model=gpt-4o-mini, app.tenant=acme]",
                     "booking [gen_ai.request.model=gpt-4o-mini]"]
    plain = {r.key.scenario for r in assemble_all(spans)}
    assert plain == {"booking"}


def test_key_values_are_cut_and_the_config_is_checked() -> None:
    spans = _run(4, "m" * 100, "t")
    (run,) = assemble_all(spans, key_attributes=("gen_ai.request.model",))
    assert run.key.scenario == f"booking [gen_ai.request.model={'m' * 64}]"
    for bad in ([""], [f"a{i}" for i in range(9)]):
        try:
            MonitorConfig.from_mapping({"streams": {"key_attributes": bad}})
        except ConfigError:
            continue
        raise AssertionError(f"accepted {bad!r}")


def test_the_monitor_keeps_a_key_attribute_it_would_otherwise_skip_at_decode() -> None:
    cfg = MonitorConfig.from_mapping({
        "listen": {"otlp_grpc": "", "otlp_http": "127.0.0.1:0", "metrics": "127.0.0.1:0"},
        "assembler": {"grace_seconds": 0.2},
        "streams": {"key_attributes": ["app.tenant"]}})
    mon = Monitor(cfg)
    mon.start()
    try:
        http = OtlpHttp(mon.addresses["otlp_http"])
        assert http.post(proto_bytes(_run(5, "gpt-4o-mini", "acme"))).status == 200
        http.close()
        deadline = time.monotonic() + 10
        while not mon.engine.streams() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [st.key.scenario for st in mon.engine.streams()] == [
            "booking [app.tenant=acme]"]
    finally:
        mon.stop()
