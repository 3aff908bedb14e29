"""Generate the reference sections of README.md and monitor/README.md from the code.

``python -m tools.gendocs`` rewrites every generated section in place;
``--check`` writes nothing and exits 1 naming the stale sections (a test runs it). A
generated section sits between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED: name -->``; text outside the markers is hand-written and kept.

Sources, so the reference cannot drift from what the code does:

``cli``       the argparse parsers of :func:`assaywatch.monitor.cli.build_parser`;
``config``    :func:`assaywatch.monitor.config.iter_options` (every option, its default and
              its ``metadata["doc"]``), with a complete YAML file of the defaults;
``env``       :data:`assaywatch.monitor.config.ENV_VARS` and the demo's ``DEMO_ENV_VARS``;
``gate``      the fields of :class:`assaywatch.monitor.offline.gate.GatePolicy`;
``metrics``   every metric family constructed in ``monitor/exporters/prometheus.py`` (read with
              :mod:`ast`, because some families only appear once a stream reaches a state,
              e.g. after its first Hotelling test), with its type, labels and help text;
``dialects``  the value tables of :mod:`assaywatch.monitor.pipeline.dialects`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXPORTER = ROOT / "monitor" / "exporters" / "prometheus.py"
MARKER = re.compile(r"(<!-- BEGIN GENERATED: (\w+) -->\n)(.*?)(<!-- END GENERATED: \2 -->)",
                    re.S)


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(value: object) -> str:
    if isinstance(value, str):
        return f'`"{value}"`' if value else '`""`'
    return f"`{json.dumps(value)}`"


# -- CLI ---------------------------------------------------------------------------------
def iter_commands(parser: argparse.ArgumentParser | None = None,
                  prefix: str = "") -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """Yield (command path, parser, one-line help) for every (sub)command, depth first."""
    from assaywatch.monitor.commands.cli import build_parser

    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                path = f"{prefix}{name}"
                yield path, sub, helps.get(name, "")
                yield from iter_commands(sub, f"{path} ")


def iter_cli_options(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, str]]:
    """Yield (usage form, default, help) for every argument of one parser but ``--help``."""
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if a.option_strings:
            form = ", ".join(a.option_strings)
            if a.nargs != 0:
                metavar = a.metavar or (a.dest.upper() if not a.choices else
                                        "{" + ",".join(map(str, a.choices)) + "}")
                form += f" {metavar}"
        else:
            form = str(a.metavar or a.dest)
        default = "" if a.default in (None, False, argparse.SUPPRESS) or a.nargs == 0 \
            else str(a.default)
        # the formatter expands %(default)s and friends exactly as --help prints them
        help_ = parser._get_formatter()._expand_help(a) if a.help else ""
        yield form, default, help_


def cli_section() -> str:
    out = []
    for path, parser, help_ in iter_commands():
        usage = " ".join(parser.format_usage().split())
        usage = usage.removeprefix("usage: ")
        out.append(f"#### `assaywatch {path}`\n")
        if help_:
            out.append(f"{_cell(help_[:1].upper() + help_[1:])}.\n")
        out.append(f"```\n{usage}\n```\n")
        rows = list(iter_cli_options(parser))
        if rows:
            out.append("| Argument | Default | Meaning |\n|---|---|---|")
            out += [f"| `{_cell(f)}` | {_cell(d)} | {_cell(h)} |" for f, d, h in rows]
            out.append("")
    return "\n".join(out)


# -- configuration -----------------------------------------------------------------------
def config_section() -> str:
    from assaywatch.monitor.config import MonitorConfig, iter_options

    rows = [f"| `{key}` | {_code(default)} | {_cell(doc)} |"
            for key, default, doc in iter_options()]
    full = yaml.safe_dump(dataclasses.asdict(MonitorConfig()), sort_keys=False,
                          default_flow_style=False).rstrip()
    return "\n".join(["| Key | Default | Meaning |", "|---|---|---|", *rows, "",
                      "The same defaults as a complete file (`--config monitor.yaml`):", "",
                      "```yaml", full, "```", ""])


def env_section() -> str:
    from assaywatch.monitor.commands.demo import DEMO_ENV_VARS
    from assaywatch.monitor.config import ENV_VARS

    rows = [f"| `{name}` | `assaywatch monitor` | {_cell(doc)} |"
            for name, doc in ENV_VARS.items()]
    rows += [f"| `{name}` | `assaywatch demo` | {_cell(doc)} |"
             for name, doc in DEMO_ENV_VARS.items()]
    return "\n".join(["| Variable | Read by | Meaning |", "|---|---|---|", *rows, ""])


def gate_section() -> str:
    from assaywatch.monitor.offline.gate import GatePolicy

    rows = []
    for f in dataclasses.fields(GatePolicy):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        rows.append(f"| `{f.name}` | {_code(default)} | {_cell(f.metadata.get('doc', ''))} |")
    return "\n".join(["| Key | Default | Meaning |", "|---|---|---|", *rows, ""])


# -- metrics -----------------------------------------------------------------------------
_FAMILY_TYPES = {"CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge",
                 "gauge": "gauge", "counter": "counter"}


def _literal(node: ast.expr, names: dict[str, Any]) -> Any:
    """Evaluate the few expression shapes the exporter uses for names, docs and labels."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e, names) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left, names) + _literal(node.right, names)
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _literal(node.values[-1], names)
    raise ValueError(f"{EXPORTER.name}:{node.lineno}: cannot read {ast.dump(node)[:60]}")


def metric_families(path: Path = EXPORTER) -> list[tuple[str, str, list[str], str]]:
    """(exposed name, type, labels, help) of every family the Prometheus exporter constructs.

    A counter family ``assaywatch_x`` is exposed as ``assaywatch_x_total``. The stream
    families' helpers ``rows.gauge(name, doc, extra)`` and ``rows.counter(...)`` add the
    stream labels to ``extra`` (unless ``keyed=False``).
    """
    from assaywatch.monitor.exporters import prometheus as exporter

    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {"KEY_LABELS": list(exporter.KEY_LABELS), "extra": []}
    seen: dict[str, tuple[str, str, list[str], str]] = {}
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    for node in calls:
        if not isinstance(node, ast.Call):
            continue
        fn = node.func.id if isinstance(node.func, ast.Name) else \
            node.func.attr if isinstance(node.func, ast.Attribute) else None
        if fn not in _FAMILY_TYPES or len(node.args) < 2:
            continue
        if isinstance(node.args[0], ast.Name):  # inside the gauge() helper itself
            continue
        name, doc = _literal(node.args[0], names), _literal(node.args[1], names)
        if not isinstance(name, str) or not name.startswith("assaywatch_"):
            continue
        kind = _FAMILY_TYPES[fn]
        if fn in ("gauge", "counter"):  # the stream families: ``rows.gauge(name, doc, extra)``
            kw = {k.arg: k.value for k in node.keywords}
            extra = _literal(node.args[2], names) if len(node.args) > 2 else []
            keyed = not (isinstance(kw.get("keyed"), ast.Constant)
                         and kw["keyed"].value is False)  # type: ignore[union-attr]
            labels = (list(exporter.KEY_LABELS) if keyed else []) + list(extra)
        else:
            kw = {k.arg: k.value for k in node.keywords}
            labels = list(_literal(kw["labels"], names)) if "labels" in kw else []
        exposed = f"{name}_total" if kind == "counter" else name
        seen.setdefault(exposed, (exposed, kind, labels, doc))
    return list(seen.values())


def metrics_section() -> str:
    rows = [f"| `{name}` | {kind} | {', '.join(f'`{x}`' for x in labels) or '-'} | "
            f"{_cell(doc)} |" for name, kind, labels, doc in metric_families()]
    return "\n".join(["| Metric | Type | Labels | Meaning |", "|---|---|---|---|", *rows, ""])


# -- dialects ----------------------------------------------------------------------------
def dialect_tables() -> list[tuple[str, str, dict[str, Any]]]:
    """(dialect, attribute key, value -> kind) in the normalizer's precedence order
    (:func:`assaywatch.monitor.pipeline.normalize.classify` reads the keys in this order)."""
    from assaywatch.monitor.pipeline import dialects as d

    return [
        ("OpenTelemetry GenAI semantic conventions", "gen_ai.operation.name",
         d.OPERATION_KINDS),
        ("OpenInference (Arize Phoenix)", "openinference.span.kind", d.OPENINFERENCE_KINDS),
        ("OpenLLMetry / Traceloop", "traceloop.span.kind", d.TRACELOOP_KINDS),
        ("Langfuse", "langfuse.observation.type", d.LANGFUSE_KINDS),
        ("OpenLLMetry LLM spans", "llm.request.type", d.LLM_REQUEST_KINDS),
    ]


def dialects_section() -> str:
    from assaywatch.monitor.pipeline import dialects as d

    out = ["| Precedence | Dialect | Attribute | Values read (-> step kind) |", "|---|---|---|---|"]
    for i, (dialect, key, table) in enumerate(dialect_tables(), 1):
        values = ", ".join(f"`{v}`->{k.value}" for v, k in table.items())
        out.append(f"| {i} | {dialect} | `{key}` | {values} |")
    out.append("")
    keys = [("model", d.MODEL_KEYS), ("provider", d.PROVIDER_KEYS),
            ("input tokens", d.INPUT_TOKEN_KEYS), ("output tokens", d.OUTPUT_TOKEN_KEYS),
            ("cost", d.COST_KEYS), ("scenario", d.SCENARIO_KEYS),
            ("output length (content attributes: only their length is kept)",
             d.OUTPUT_CONTENT_KEYS)]
    out += ["Attribute keys read for each fact, first present wins:", "",
            "| Fact | Keys |", "|---|---|"]
    out += [f"| {fact} | {', '.join(f'`{k}`' for k in ks)} |" for fact, ks in keys]
    prefixes = ", ".join(f"`{p}`" for p in sorted(d.PROVIDER_SPAN_PREFIXES))
    suffixes = ", ".join(f"`{s}`" for s in d.PROVIDER_SPAN_SUFFIXES)
    out += ["", f"Traceloop provider spans named `<provider>.<call>` are model calls for the "
            f"providers {prefixes} and the calls {suffixes}. Step kinds map to the "
            "fingerprint's actions as: " + ", ".join(
                f"{k.value}->{a.value}" for k, a in d.ACTION_OF_KIND.items()) + ".", ""]
    return "\n".join(out)


#: Generated sections per file (relative to the repository root).
SECTIONS: dict[str, dict[str, Callable[[], str]]] = {
    "monitor/README.md": {"cli": cli_section, "config": config_section, "env": env_section,
                          "gate": gate_section, "metrics": metrics_section,
                          "dialects": dialects_section},
    "README.md": {"metrics": metrics_section},
}


def render(text: str, generators: dict[str, Callable[[], str]], where: str) -> str:
    """Replace every marked section of ``text``; ValueError when one is missing."""
    found = {m.group(2) for m in MARKER.finditer(text)}
    missing = sorted(set(generators) - found)
    if missing:
        raise ValueError(f"{where}: no generated section(s) {missing}; add the lines "
                         f"'<!-- BEGIN GENERATED: NAME -->' and '<!-- END GENERATED: NAME -->'")
    return MARKER.sub(lambda m: m.group(1) + (generators[m.group(2)]() + "\n"
                                              if m.group(2) in generators else m.group(3))
                      + m.group(4), text)


def stale(root: Path = ROOT) -> list[str]:
    """Files whose generated sections differ from what the code generates now."""
    out = []
    for rel, gens in SECTIONS.items():
        text = (root / rel).read_text(encoding="utf-8")
        if render(text, gens, rel) != text:
            out.append(rel)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gendocs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a generated section is stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root")
    args = parser.parse_args(argv)
    try:
        if args.check:
            bad = stale(args.root)
            if bad:
                print(f"stale generated reference in {', '.join(bad)}: run "
                      "`python -m tools.gendocs` and commit the result",
                      file=sys.stderr)
                return 1
            return 0
        for rel, gens in SECTIONS.items():
            path = args.root / rel
            text = path.read_text(encoding="utf-8")
            new = render(text, gens, rel)
            if new != text:
                path.write_text(new, encoding="utf-8")
                print(f"updated {rel}")
    except (OSError, ValueError) as exc:
        print(f"python -m tools.gendocs: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
