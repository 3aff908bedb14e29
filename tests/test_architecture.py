"""The package's import graph: no cycles, and every import points down the pipeline.

Every ``import`` statement of the installed package is read with ``ast`` (module level,
inside functions and under ``TYPE_CHECKING`` alike: a lazy import is still a dependency).
Rooms are the folders a newcomer reads in monitor/README.md; their order is the order
data flows, and a module may import only from its own room or from rooms listed before it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: distribution package -> source folder (pyproject's package-dir)
PACKAGE_DIRS = {
    "assaywatch": ROOT / "instrumentation" / "root",
    "assaywatch.instrumentation": ROOT / "instrumentation",
    "assaywatch.analyzers": ROOT / "analyzers",
    "assaywatch.monitor": ROOT / "monitor",
    "assaywatch.dashboards": ROOT / "dashboards",
}

#: Rooms in dependency order: a module may import its own room or an earlier one.
ROOMS = [
    "assaywatch.instrumentation",     # light code inside users' agents
    "assaywatch",                     # the root package: version, ``auto``
    "assaywatch.analyzers",           # the statistics, pure functions over runs
    "assaywatch.monitor.config",      # the one YAML file every stage reads its section of
    "assaywatch.monitor.receivers",   # stage 1: OTLP and span files in, SpanRecords out
    "assaywatch.monitor.pipeline",    # stage 2: spans -> runs with outcomes
    "assaywatch.monitor.engine",      # stage 3: runs -> baselines, detectors, alarms
    "assaywatch.monitor.exporters",   # stage 4: Prometheus, status page and API, event log
    "assaywatch.monitor.service",     # stage 5: the running monitor wiring 1-4, its state
    "assaywatch.monitor.scaleout",    # stage 5 on Kafka: assemblers and detector workers
    "assaywatch.monitor.offline",     # entry: gate, replay, baselines over span files
    "assaywatch.monitor.live",        # entry: live gate and the stochastic pytest plugin
    "assaywatch.monitor.demo",        # entry: the simulated agent and its terminal view
    "assaywatch.dashboards",          # Grafana dashboards and alert rules, generate + push
    "assaywatch.monitor.commands",    # the command line composing the entries
]

#: The only imports allowed to point up the order, each with its reason.
ALLOWED_UPWARD = {
    # ``assaywatch.stochastic`` is a lazy attribute of the root package (PEP 562): the
    # decorator is found by its public name, but ``import assaywatch`` loads none of it.
    ("assaywatch", "assaywatch.monitor.live.stochastic"),
}


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder)
            if pkg != "assaywatch" and rel.parts[0] == "root":
                continue  # instrumentation/root is the root package, listed on its own
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in mods else base)
            for t in targets:
                if t.startswith("assaywatch") and t != name:
                    while t not in mods and "." in t:
                        t = t.rsplit(".", 1)[0]
                    if t in mods and t != name:
                        graph[name].add(t)
    return graph


def room(module: str) -> str:
    if module in ("assaywatch", "assaywatch.auto"):
        return "assaywatch"
    best = ""
    for r in ROOMS:
        if (module == r or module.startswith(r + ".")) and len(r) > len(best):
            best = r
    if not best and module.startswith("assaywatch.monitor"):
        return "assaywatch.monitor"  # the package's own __init__
    return best or module


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


MODS = _modules()
GRAPH = _imports(MODS)


def test_the_walker_sees_known_edges() -> None:
    # A check of the checker: edges a person can read in the source.
    assert "assaywatch.monitor.receivers.spans" in GRAPH["assaywatch.monitor.pipeline.assemble"]
    assert "assaywatch.analyzers.model" in GRAPH["assaywatch.monitor.engine.engine"]
    assert "assaywatch.monitor.exporters.status" in GRAPH["assaywatch.monitor.service.monitor"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_import_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_no_room_import_cycle() -> None:
    rooms: dict[str, set[str]] = defaultdict(set)
    for src, dsts in GRAPH.items():
        for dst in dsts:
            if room(src) != room(dst) and (src, dst) not in ALLOWED_UPWARD:
                rooms[room(src)].add(room(dst))
    assert _cycles(rooms) == []


def test_every_import_points_down_the_pipeline() -> None:
    order = {r: i for i, r in enumerate(ROOMS)}
    upward = []
    for src, dsts in sorted(GRAPH.items()):
        rs = room(src)
        for dst in sorted(dsts):
            rd = room(dst)
            if rs == rd or (src, dst) in ALLOWED_UPWARD:
                continue
            if rs not in order or rd not in order or order[rd] > order[rs]:
                upward.append(f"{src} -> {dst}")
    assert upward == []


def test_instrumentation_and_analyzers_stay_light() -> None:
    bad = [f"{s} -> {d}" for s, ds in GRAPH.items() for d in ds
           if (s.startswith("assaywatch.instrumentation")
               and (d.startswith("assaywatch.monitor") or d.startswith("assaywatch.analyzers")))
           or (s.startswith("assaywatch.analyzers") and d.startswith("assaywatch.monitor"))]
    assert bad == []


def test_every_module_is_in_a_room() -> None:
    homeless = [m for m in MODS if m.startswith("assaywatch.")
                and room(m) not in ROOMS and m not in ("assaywatch.monitor",)]
    assert homeless == []
