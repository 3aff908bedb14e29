"""deploy/kafka/: the compose stack and the Kubernetes manifests fit the real command line,
the config loads, and the Collector config validates with the real Collector binary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from assaywatch.monitor.commands.cli import build_parser
from assaywatch.monitor.scaleout.settings import load_config

ROOT = Path(__file__).resolve().parents[2]
KAFKA = ROOT / "deploy" / "kafka"


def test_compose_commands_parse_and_config_loads() -> None:
    compose = yaml.safe_load((KAFKA / "docker-compose.yaml").read_text())
    stages = []
    for name, svc in compose["services"].items():
        if svc.get("image", "").startswith("assaywatch-kafka"):
            args = build_parser().parse_args(svc["command"])
            assert args.command == "kafka" and args.metrics == "0.0.0.0:9464", name
            assert args.instance_id == name  # static membership id = service name
            stages.append(args.action)
            cfg = svc["environment"]["ASSAYWATCH_CONFIG"]
            mount = next(v for v in svc["volumes"] if v.endswith(f"{cfg}:ro"))
            assert (KAFKA / mount.split(":")[0]).is_file()
    assert sorted(stages) == ["assemble"] * 2 + ["detect"] * 3
    _, ks = load_config(str(KAFKA / "monitor.yaml"))
    assert ks.bootstrap == "kafka:9092" and ks.transactions == "auto"


def test_kubernetes_manifests() -> None:
    kust = yaml.safe_load((KAFKA / "kubernetes" / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        docs = list(yaml.safe_load_all((KAFKA / "kubernetes" / res).read_text()))
        for doc in docs:
            if doc["kind"] != "StatefulSet":
                continue
            c = doc["spec"]["template"]["spec"]["containers"][0]
            args = build_parser().parse_args(c["args"])
            assert args.command == "kafka"
            env = {e["name"]: e for e in c["env"]}
            assert env["ASSAYWATCH_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == \
                "metadata.name"
    cm = yaml.safe_load((KAFKA / "kubernetes" / "configmap.yaml").read_text())
    assert yaml.safe_load(cm["data"]["monitor.yaml"]) == yaml.safe_load(
        (KAFKA / "monitor.yaml").read_text())


def test_collector_config_validates_with_the_real_collector() -> None:
    binary = Path(os.environ.get("ASSAYWATCH_OTELCOL",
                                 ROOT / "deploy" / "collector" / "bin" / "assaywatch-otelcol"))
    if not binary.is_file():
        pytest.skip("no Collector binary (deploy/collector/build.sh)")
    res = subprocess.run([str(binary), "validate", "--config", str(KAFKA / "collector.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
