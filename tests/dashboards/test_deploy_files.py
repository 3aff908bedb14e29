"""deploy/: compose, Collector, Kubernetes and provisioning files parse and fit together.

No Docker engine, Collector binary or Kubernetes cluster is available here, so these are
static checks: every file parses (PyYAML), every file the compose stack mounts or builds
from exists, the monitor is started with flags its real parser accepts and binds 0.0.0.0,
Collector configs use only components of the contrib distribution and wire their pipelines,
and the Kubernetes objects reference each other consistently.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from assaywatch.monitor.commands.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yaml"
K8S = DEPLOY / "kubernetes"
COLLECTOR = sorted((DEPLOY / "collector").glob("*.yaml"))

#: Component types of the OpenTelemetry Collector contrib distribution used by our configs.
#: Source: opentelemetry-collector-releases, distributions/otelcol-contrib/manifest.yaml
#: (receivers otlpreceiver; processors batchprocessor, memorylimiterprocessor; exporters
#: otlpexporter, otlphttpexporter, loadbalancingexporter, debugexporter; extensions
#: healthcheckextension), present in v0.115.0, the image the compose file pins.
CONTRIB_COMPONENTS = {
    "receivers": {"otlp"},
    "processors": {"batch", "memory_limiter"},
    "exporters": {"otlp", "otlphttp", "loadbalancing", "debug"},
    "extensions": {"health_check"},
}
MONITOR_PORTS = {"otlp_grpc": 4317, "otlp_http": 4318, "metrics": 9464}


def _load_all(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _k8s() -> dict[tuple[str, str], dict[str, Any]]:
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in _load_all(path):
            if doc.get("kind") != "Kustomization":
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def _check_monitor_args(args: list[str], where: str,
                        listeners: dict[str, str] | None = None) -> None:
    """The real CLI parser accepts the arguments and every listener binds 0.0.0.0 (or the
    address ``listeners`` gives it)."""
    parsed = build_parser().parse_args(args)
    assert parsed.command == "monitor", where
    assert parsed.state_dir == "/var/lib/assaywatch", where
    for flag, port in MONITOR_PORTS.items():
        expected = (listeners or {}).get(flag, f"0.0.0.0:{port}")
        assert getattr(parsed, flag) == expected, (where, flag)


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix()
                                        for p in DEPLOY.rglob("*.y*ml")))
def test_every_yaml_file_parses(path: str) -> None:
    assert _load_all(ROOT / path), f"{path} is empty"


def test_compose_mounts_and_build_files_exist() -> None:
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    named = set(compose.get("volumes", {}))
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source in named:
                continue
            assert (DEPLOY / source).exists(), f"service {name} mounts missing {source}"
        build = service.get("build")
        if build:
            context = DEPLOY / build["context"]
            assert (context / build["dockerfile"]).is_file(), name
            assert (context / "pyproject.toml").is_file(), "build context is not the repo root"


def test_compose_wires_the_stack_together() -> None:
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services = compose["services"]
    assert set(services) == {"otel-collector", "assaywatch", "prometheus", "alertmanager",
                             "grafana"}
    _check_monitor_args(services["assaywatch"]["command"], "compose assaywatch")
    assert any(v.endswith(":/var/lib/assaywatch") and v.split(":")[0] in compose["volumes"]
               for v in services["assaywatch"]["volumes"]), "monitor state is not a volume"
    for name, service in services.items():  # host ports are loopback-only by default
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    # the Collector forwards to the monitor service's OTLP gRPC port
    collector = yaml.safe_load((DEPLOY / "collector" / "agents-to-monitor.yaml").read_text())
    assert collector["exporters"]["otlp/assaywatch"]["endpoint"] == "assaywatch:4317"
    # Prometheus: the rules folder mounted where prometheus.yml loads rules from, scraping
    # the monitor, alerting to Alertmanager
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    mount = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    rules_dir = prom["rule_files"][0].rsplit("/", 1)[0]
    assert (DEPLOY / mount[rules_dir]).resolve() == ROOT / "dashboards" / "alerts"
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["assaywatch"]["static_configs"][0]["targets"] == ["assaywatch:9464"]
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "alertmanager:9093"]
    # Grafana: the provider's path holds the mounted dashboards, the alert rules name the
    # provisioned datasource
    grafana = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/assaywatch.yaml")
                              .read_text())["providers"][0]
    mounted = {Path(target).name for target in grafana
               if target.startswith(provider["options"]["path"] + "/")}
    assert mounted == {p.name for p in (ROOT / "dashboards").glob("*.json")}
    assert (DEPLOY / grafana["/etc/grafana/provisioning/alerting"]).resolve() == (
        ROOT / "dashboards" / "grafana-alerting")
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/assaywatch.yaml")
                                .read_text())["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    rules = (ROOT / "dashboards/grafana-alerting/assaywatch-alerts.yaml").read_text()
    assert set(re.findall(r"datasourceUid: (\S+)", rules)) == {datasource["uid"], "__expr__"}


def test_dockerfile_starts_the_monitor_on_all_interfaces() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    cmd = re.search(r'^CMD \[(.*?)\]', text, re.S | re.M)
    assert cmd is not None
    args = re.findall(r'"([^"]*)"', cmd.group(1))
    _check_monitor_args(args, "Dockerfile CMD")
    assert 'ENTRYPOINT ["assaywatch"]' in text and "USER 10001" in text


@pytest.mark.parametrize("path", COLLECTOR, ids=lambda p: p.name)
def test_collector_config_uses_contrib_components_and_wires_pipelines(path: Path) -> None:
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    for kind, known in CONTRIB_COMPONENTS.items():
        for component in config.get(kind, {}):
            assert component.split("/")[0] in known, f"{path.name}: {kind} {component}"
    service = config["service"]
    assert set(service.get("extensions", [])) <= set(config.get("extensions", {}))
    for name, pipeline in service["pipelines"].items():
        assert name.split("/")[0] == "traces", "the monitor takes traces only"
        for kind in ("receivers", "processors", "exporters"):
            missing = set(pipeline.get(kind, [])) - set(config.get(kind, {}))
            assert not missing, f"{path.name} {name}: undefined {kind} {missing}"
        # memory_limiter must come first to refuse data before memory runs out
        assert pipeline["processors"][0] == "memory_limiter", path.name
    for receiver in config["receivers"].values():
        for proto, port in (("grpc", 4317), ("http", 4318)):
            assert receiver["protocols"][proto]["endpoint"] == f"0.0.0.0:{port}", path.name


def test_collector_topologies() -> None:
    by_name = {p.name: yaml.safe_load(p.read_text()) for p in COLLECTOR}
    assert set(by_name) == {"agents-to-monitor.yaml", "loadbalancing.yaml", "fanout.yaml"}
    lb = by_name["loadbalancing.yaml"]["exporters"]["loadbalancing"]
    # service.name routing keeps every run of a stream on one monitor (DESIGN.md Scale-out)
    assert lb["routing_key"] == "service"
    headless = _k8s()[("Service", "assaywatch-monitor-headless")]
    assert lb["resolver"]["dns"]["hostname"] == (
        f"{headless['metadata']['name']}.{headless['metadata']['namespace']}.svc.cluster.local")
    # a string: the exporter's DNS resolver refuses an integer port (the real Collector's
    # `validate`, tests/scaleout/test_collector_configs.py)
    assert lb["resolver"]["dns"]["port"] == "4317"
    fanout = by_name["fanout.yaml"]["service"]["pipelines"]["traces"]["exporters"]
    assert len(fanout) == 2 and "otlp/assaywatch" in fanout


def test_kubernetes_objects_reference_each_other() -> None:
    objects = _k8s()
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file() or (K8S / resource / "kustomization.yaml").is_file(), \
            resource
    assert "../admission" in kustomization["resources"]
    sts = objects[("StatefulSet", "assaywatch-monitor")]
    pod = sts["spec"]["template"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert ("Service", sts["spec"]["serviceName"]) in objects
    container, admission = pod["spec"]["containers"]
    # OTLP goes through the admission container (deploy/admission/haproxy.cfg): the monitor's
    # receivers listen on the pod's loopback, where the proxy's environment sends
    env = {e["name"]: e["value"] for e in admission["env"]}
    _check_monitor_args(container["args"], "StatefulSet args",
                        {"otlp_grpc": env["ASSAYWATCH_MONITOR_GRPC"],
                         "otlp_http": env["ASSAYWATCH_MONITOR_HTTP"]})
    assert env["ASSAYWATCH_MONITOR_GRPC"].startswith("127.0.0.1:")
    assert env["ASSAYWATCH_MONITOR_HTTP"].startswith("127.0.0.1:")
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 9464}
    proxy_ports = {p["name"]: p["containerPort"] for p in admission["ports"]}
    assert proxy_ports == {"otlp-grpc": 4317, "otlp-http": 4318, "admission": 8405}
    assert (env["ASSAYWATCH_ADMISSION_GRPC"], env["ASSAYWATCH_ADMISSION_HTTP"],
            env["ASSAYWATCH_ADMISSION_STATS"]) == ("0.0.0.0:4317", "0.0.0.0:4318",
                                                    "0.0.0.0:8405")
    # the proxy reads the shipped file, from the ConfigMap deploy/admission generates
    mount = next(m for m in admission["volumeMounts"]
                 if m["mountPath"] == "/usr/local/etc/haproxy")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    generated = yaml.safe_load((DEPLOY / "admission" / "kustomization.yaml").read_text())
    assert [g["name"] for g in generated["configMapGenerator"]] == [volume["configMap"]["name"]]
    assert generated["configMapGenerator"][0]["files"] == ["haproxy.cfg"]
    assert admission["args"] == ["-f", "/usr/local/etc/haproxy/haproxy.cfg"]
    ports = {**proxy_ports, "metrics": 9464}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    claim = sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    assert any(m["name"] == claim and m["mountPath"] == "/var/lib/assaywatch"
               for m in container["volumeMounts"])
    for (kind, name), obj in objects.items():
        if kind == "Service":
            assert obj["spec"]["selector"].items() <= pod["metadata"]["labels"].items(), name
            for port in obj["spec"]["ports"]:
                assert port["targetPort"] in ports, (name, port)
    monitor = objects[("ServiceMonitor", "assaywatch-monitor")]
    service = objects[("Service", "assaywatch-monitor")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items())
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"metrics", "admission"}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in
                                                                service["spec"]["ports"]}
    assert all(o["metadata"].get("namespace", "assaywatch") == "assaywatch"
               for o in objects.values())
