"""The documentation says what the code does: the generated reference is current, it names
every CLI option, config key, environment variable and metric, and README's commands are
the ones CI runs."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from tools import gendocs as docs

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MONITOR_README = (ROOT / "monitor" / "README.md").read_text(encoding="utf-8")
COMMAND_LINE = re.compile(r"^    \$ (.*)$", re.M)


def test_generated_reference_is_current() -> None:
    assert docs.stale() == [], "run `python -m tools.gendocs` and commit the result"
    res = subprocess.run(["python", "-m", "tools.gendocs", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_check_fails_on_a_stale_section(tmp_path: Path) -> None:
    for rel in docs.SECTIONS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    path = tmp_path / "monitor" / "README.md"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("| `detectors.arl0` |", "| `detectors.arl_zero` |"),
                    encoding="utf-8")
    assert docs.stale(tmp_path) == ["monitor/README.md"]
    assert docs.main(["--check", "--root", str(tmp_path)]) == 1
    assert docs.main(["--root", str(tmp_path)]) == 0  # regenerating repairs it
    assert docs.stale(tmp_path) == []
    path.write_text(text.replace("<!-- END GENERATED: env -->", ""), encoding="utf-8")
    with pytest.raises(ValueError, match="no generated section"):
        docs.stale(tmp_path)


def test_every_cli_command_and_option_is_in_the_reference() -> None:
    commands = list(docs.iter_commands())
    assert {"monitor", "gate", "replay", "demo", "baseline build"} <= {c for c, _, _ in commands}
    for path, parser, _ in commands:
        assert f"#### `assaywatch {path}`" in MONITOR_README, path
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            for opt in action.option_strings:
                assert re.search(rf"(`|, ){re.escape(opt)}[ `,]", MONITOR_README), \
                    f"assaywatch {path} {opt} is not in monitor/README.md"


def test_every_config_key_env_var_and_gate_option_is_in_the_reference() -> None:
    from assaywatch.monitor.commands.demo import DEMO_ENV_VARS
    from assaywatch.monitor.config import ENV_VARS, iter_options
    from assaywatch.monitor.offline.gate import GatePolicy

    keys = [k for k, _, _ in iter_options()]
    assert "detectors.arl0" in keys and "listen.metrics" in keys
    for key in keys:
        assert f"| `{key}` |" in MONITOR_README, key
    for var in [*ENV_VARS, *DEMO_ENV_VARS]:
        assert f"| `{var}` |" in MONITOR_README, var
    gate = MONITOR_README.split("### Gate configuration", 1)[1]
    for f in GatePolicy.__dataclass_fields__:
        assert f"| `{f}` |" in gate, f
    # the full YAML of defaults in the reference loads back to the defaults
    from assaywatch.monitor.config import MonitorConfig

    block = re.search(r"```yaml\n(listen:.*?)```", MONITOR_README, re.S)
    assert block is not None
    assert MonitorConfig.from_mapping(yaml.safe_load(block.group(1))) == MonitorConfig()


def test_metrics_table_covers_what_the_exporter_exposes_and_the_contract() -> None:
    from assaywatch.analyzers.model import StreamKey
    from assaywatch.dashboards.grafana import METRIC_FAMILIES
    from assaywatch.monitor.config import DetectorConfig
    from assaywatch.monitor.engine.engine import Engine
    from assaywatch.monitor.exporters.prometheus import MonitorCollector
    from assaywatch.monitor.receivers.spans import IngestCounters
    from tests.analyzers.simagent import simulate_runs

    documented = {name: labels for name, _, labels, _ in docs.metric_families()}
    # the DESIGN.md contract the dashboards are written against, with the same labels
    assert documented == {k: list(v) for k, v in METRIC_FAMILIES.items()}
    # a stream past its baseline and its first Hotelling test exposes only documented names
    # SPRT and Hotelling only: the CUSUM families are yielded (empty) all the same, and
    # calibrating the fingerprint CUSUM on a small baseline would take seconds
    engine = Engine(DetectorConfig(learn_runs=40, hotelling_window=20, hotelling_every=10,
                                   detectors=["sprt", "hotelling"]))
    key = StreamKey("a", "1", "s")
    for run in simulate_runs(70, np.random.default_rng(3), key=key):
        engine.process(run)
    exposed = set()
    for fam in MonitorCollector(engine, IngestCounters()).collect():
        exposed.add(f"{fam.name}_total" if fam.type == "counter" else fam.name)
    assert {"assaywatch_hotelling_p_value", "assaywatch_cusum_statistic",
            "assaywatch_verdict", "assaywatch_runs_total"} <= exposed
    assert exposed <= set(documented), exposed - set(documented)
    for readme in (README, MONITOR_README):
        for name in documented:
            assert f"| `{name}` |" in readme, name


def test_readme_commands_are_the_ones_ci_runs() -> None:
    lines = COMMAND_LINE.findall(README)
    assert len(lines) == 2, lines
    install_demo, test_cmd = lines
    assert install_demo.endswith("assaywatch demo")
    assert "pip install -e '.[monitor]'" in install_demo
    assert test_cmd.endswith("python -m pytest") and "pip install -e '.[dev]'" in test_cmd
    # the two commands come first, right under the title's paragraph
    assert README.index("## Two commands") < README.index("    $ ") < README.index("## The")
    # .ci/run extracts the test command with sed: run its own extraction on README
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    m = re.search(r"^test_cmd=\$\((sed .*? README\.md.*)\)$", ci, re.M)
    assert m, "no test_cmd=$(sed ... README.md ...) line in .ci/run"
    res = subprocess.run(["bash", "-c", m.group(1)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == test_cmd
    assert 'bash -euo pipefail -c "$test_cmd"' in ci


def test_readme_examples_use_real_options() -> None:
    from assaywatch.monitor.config import MonitorConfig
    from assaywatch.monitor.pipeline.outcome import ContractRules

    config = re.search(r"<<'YAML'\n(.*?)\nYAML\n", README, re.S)
    assert config is not None
    cfg = MonitorConfig.from_mapping(yaml.safe_load(config.group(1)), "README example")
    ContractRules.from_dict(cfg.contracts)
    gate = {c: p for c, p, _ in docs.iter_commands()}["gate"]
    opts = {o for a in gate._actions for o in a.option_strings}
    step = re.search(r"assaywatch gate (.*?)\n- name", README, re.S)
    assert step is not None
    used = set(re.findall(r"(--[a-z-]+)", step.group(1)))
    assert {"--junit", "--markdown", "--baseline", "--candidate"} <= used <= opts
