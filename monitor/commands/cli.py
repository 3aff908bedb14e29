"""The ``assaywatch`` command line.

Each subcommand lives in ``assaywatch.monitor.commands.<name>`` and exposes
``register(subparsers) -> None``; its parser's ``func`` default is called with the parsed
arguments and returns the exit code. Command modules import heavy dependencies inside
their ``func`` so that ``assaywatch --help`` stays fast.

Exit codes common to every command: 0 success, 3 invalid input or usage (a message on
stderr, never a traceback). ``gate`` adds 1 (block) and 2 (manual review).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import assaywatch
from assaywatch.monitor.commands.errors import UsageError

__all__ = ["EXIT_USAGE", "UsageError", "build_parser", "main"]

EXIT_USAGE = 3

#: Subcommand modules, in the order ``--help`` lists them.
COMMANDS = (
    "monitor",
    "baseline",
    "gate",
    "replay",
    "plan",
    "mutate",
    "demo",
    "record",
    "kafka",
    "dashboards",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="assaywatch",
        description=(
            "Statistical regression detection for AI agents traced with OpenTelemetry: "
            "a monitor for live OTLP span streams, and an offline pre-deploy gate."
        ),
    )
    parser.add_argument("--version", action="version",
                        version=f"assaywatch {assaywatch.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"assaywatch.monitor.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"assaywatch.monitor.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    try:
        return int(func(args))
    except UsageError as exc:
        print(f"assaywatch: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a file, directory or port the command was given or needs
        where = f" {exc.filename}" if exc.filename else ""
        print(f"assaywatch: error:{where} {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("assaywatch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
