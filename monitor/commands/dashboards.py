"""``assaywatch dashboards export DIR`` and ``assaywatch dashboards push --url URL``.

``export`` writes the Grafana dashboards, the Prometheus alert rules (with their promtool
tests) and the Grafana-managed alert rules to a folder, ready for file provisioning.
``push`` creates or updates the dashboards in a running Grafana through its HTTP API
(grafana-client), by stable uid, so running it again updates in place.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

#: Environment variable read for the Grafana token when ``--token`` is not given.
ENV_GRAFANA_TOKEN = "GRAFANA_TOKEN"
EXIT_USAGE = 3


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboards", help="export or push the Grafana dashboards and alert rules",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    sub = parser.add_subparsers(dest="dashboards_command", metavar="ACTION",
                                parser_class=type(parser))
    parser.set_defaults(func=lambda args: _missing_action(parser))

    export = sub.add_parser("export", help="write dashboards and rules to DIR")
    export.add_argument("directory", metavar="DIR", type=Path, help="folder to write into")
    export.add_argument("--source", type=Path, default=None,
                        help="dashboards folder to read (default: the shipped one, or "
                             "$ASSAYWATCH_DASHBOARDS_DIR)")
    export.set_defaults(func=_export)

    push = sub.add_parser("push", help="create or update the dashboards in Grafana")
    push.add_argument("--url", required=True,
                      help="Grafana base URL, e.g. http://grafana:3000 (a sub-path is kept)")
    auth = push.add_mutually_exclusive_group()
    auth.add_argument("--token", help=f"service-account or API token (default: "
                                      f"${ENV_GRAFANA_TOKEN})")
    auth.add_argument("--basic-auth", metavar="USER:PASSWORD", help="basic authentication")
    push.add_argument("--folder", default="assaywatch",
                      help="folder title to put the dashboards in; created when missing "
                           "(default: %(default)s)")
    push.add_argument("--source", type=Path, default=None,
                      help="dashboards folder to read (default: the shipped one)")
    push.add_argument("--timeout", type=float, default=10.0,
                      help="HTTP timeout in seconds (default: %(default)s)")
    push.set_defaults(func=_push)


def _missing_action(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _fail(message: str) -> int:
    print(f"assaywatch dashboards: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _export(args: argparse.Namespace) -> int:
    from assaywatch.dashboards.grafana import export_assets

    try:
        written = export_assets(args.directory, args.source)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    for path in written:
        print(path)
    return 0


def _push(args: argparse.Namespace) -> int:
    from assaywatch.dashboards.grafana import (
        GrafanaPushError,
        dashboards_dir,
        load_dashboards,
        push_dashboards,
    )

    credential: str | tuple[str, str] | None = args.token or os.environ.get(ENV_GRAFANA_TOKEN)
    if args.basic_auth:
        user, sep, password = args.basic_auth.partition(":")
        if not sep or not user:
            return _fail("--basic-auth takes USER:PASSWORD")
        credential = (user, password)
    if not args.url.startswith(("http://", "https://")):
        return _fail(f"--url {args.url!r} must start with http:// or https://")
    try:
        boards = load_dashboards(args.source or dashboards_dir())
        result = push_dashboards(args.url, credential, args.folder, boards, args.timeout)
    except (ValueError, GrafanaPushError) as exc:
        return _fail(str(exc))
    state = "created" if result.folder_created else "existing"
    print(f"Grafana {result.grafana_version}: {len(result.dashboards)} dashboards saved in "
          f"{state} folder {args.folder!r} (uid {result.folder_uid}): "
          + ", ".join(result.dashboards))
    return 0
