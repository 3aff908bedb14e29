"""Run the benchmarks: ``python -m tests.benchmarks [NAME ...]`` (NAME without ``bench_``)."""

from __future__ import annotations

import importlib
import platform
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(p.stem for p in here.glob("bench_*.py"))
    if argv:
        wanted = {a if a.startswith("bench_") else f"bench_{a}" for a in argv}
        unknown = wanted - set(names)
        if unknown:
            print(f"unknown benchmark(s) {sorted(unknown)}; have {names}", file=sys.stderr)
            return 3
        names = [n for n in names if n in wanted]
    print(f"# machine: {platform.machine()}, {platform.python_implementation()} "
          f"{platform.python_version()}, {platform.system()}; cores: "
          f"{len(__import__('os').sched_getaffinity(0))}")
    for name in names:
        module = importlib.import_module(f"tests.benchmarks.{name}")
        print(f"\n## {name}")
        t0 = time.perf_counter()
        module.main()
        print(f"({name}: {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
