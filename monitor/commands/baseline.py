"""``assaywatch baseline build``, ``assaywatch baseline reset`` and
``assaywatch baseline delete``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("baseline",
                       help="build a baseline from span files, or reset or delete a live stream",
                       description="Baselines are frozen per-stream reference statistics "
                                   "(pass counts, fingerprint mean and covariance, coverage).")
    bsub = p.add_subparsers(dest="baseline_command", metavar="ACTION", required=True)
    b = bsub.add_parser("build", help="build per-stream baselines from span exports",
                        description="Read span files (OTLP JSON Lines, plain or gzip; "
                                    "Collector proto files; Jaeger or Tempo JSON), assemble "
                                    "runs and write one baseline per stream "
                                    "(agent, version, scenario) to a JSON file.")
    b.add_argument("files", nargs="+", metavar="FILE", help="span files")
    b.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="baseline JSON to write")
    b.add_argument("--tools", metavar="NAME", nargs="+", default=None,
                   help="the agents' tool inventory (default: the tools observed)")
    b.add_argument("--config", metavar="FILE", default=None,
                   help="gate config (its evaluation_threshold and contracts decide outcomes)")
    b.add_argument("--strict", action="store_true",
                   help="fail on the first bad record instead of skipping and counting it")
    b.set_defaults(func=build)
    for action, helptext, desc in (
            ("reset", "make a running monitor re-learn a stream's baseline",
             "POST /api/rebaseline to a running monitor: the stream forgets its baseline "
             "and learns a new one from its next runs."),
            ("delete", "make a running monitor forget a stream entirely",
             "POST /api/streams/delete to a running monitor: the stream's baseline, "
             "detectors, counts and series are forgotten (a retired version, a junk name); "
             "a later run of it starts a new stream.")):
        _stream_action(bsub, action, helptext, desc)


def _stream_action(bsub: Any, action: str, helptext: str, desc: str) -> None:
    r = bsub.add_parser(action, help=helptext,
                        description=desc + " The monitor wants its API token: "
                                    "ASSAYWATCH_API_TOKEN, else the api-token file in its "
                                    "state dir (--state-dir).")
    r.add_argument("--url", default="http://127.0.0.1:9464",
                   help="the monitor's metrics address (default http://127.0.0.1:9464)")
    r.add_argument("--agent", required=True, metavar="NAME",
                   help="the stream's agent name")
    r.add_argument("--version", default="", dest="agent_version", metavar="V",
                   help="the stream's agent version (default: empty)")
    r.add_argument("--scenario", default="", metavar="S",
                   help="the stream's scenario (default: empty)")
    r.add_argument("--state-dir", metavar="DIR", default=None,
                   help="the monitor's state dir, whose api-token file is read when "
                        "ASSAYWATCH_API_TOKEN is not set (env ASSAYWATCH_STATE_DIR)")
    r.set_defaults(func=reset, endpoint="/api/rebaseline" if action == "reset"
                   else "/api/streams/delete")


def build(args: argparse.Namespace) -> int:
    from assaywatch.analyzers.baseline_file import baselines_to_json
    from assaywatch.monitor.commands._common import (
        build_baselines,
        check_files,
        load_runs,
        usage_error,
    )
    from assaywatch.monitor.commands.gate_io import load_policy

    check_files(args.files, "span file")
    policy = load_policy(args.config)
    runs, stats = load_runs(args.files, strict=args.strict, policy=policy)
    if not runs:
        raise usage_error(f"no agent runs found in {', '.join(args.files)} "
                          f"({stats.spans} spans read, {stats.issues} bad records skipped)")
    baselines = build_baselines(runs, args.tools, source=", ".join(args.files))
    try:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(baselines_to_json(baselines))
    except OSError as exc:
        raise usage_error(f"cannot write {args.output}: {exc.strerror}") from None
    for b in baselines:
        rate = "-" if b.pass_rate is None else f"{b.pass_rate:.3f}"
        print(f"{b.key}: {b.n_runs} runs, pass rate {rate}, {len(b.tools)} tools, "
              f"id {b.baseline_id}")
    if stats.issues:
        print(f"skipped {stats.issues} bad records (first: {stats.issue_samples[0]})",
              file=sys.stderr)
    print(f"wrote {len(baselines)} baseline(s) to {args.output}")
    return 0


def _token(state_dir: str | None) -> str | None:
    from assaywatch.monitor.commands._common import usage_error

    token = os.environ.get("ASSAYWATCH_API_TOKEN", "").strip()
    if token:
        return token
    state_dir = state_dir if state_dir is not None else os.environ.get("ASSAYWATCH_STATE_DIR")
    if not state_dir:
        return None
    path = os.path.join(state_dir, "api-token")
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError as exc:
        raise usage_error(f"cannot read the monitor's API token {path}: {exc.strerror}; "
                          "set ASSAYWATCH_API_TOKEN instead") from None


def reset(args: argparse.Namespace) -> int:
    from assaywatch.monitor.commands._common import usage_error

    body = json.dumps({"agent": args.agent, "version": args.agent_version,
                       "scenario": args.scenario}).encode()
    headers = {"Content-Type": "application/json"}
    token = _token(args.state_dir)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(args.url.rstrip("/") + args.endpoint, data=body,
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            print(resp.read().decode())
            return 0
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise usage_error(
                f"the monitor at {args.url} has no stream agent={args.agent} "
                f"version={args.agent_version!r} scenario={args.scenario!r}") from None
        try:
            detail = json.loads(exc.read()).get("error", "")
        except (ValueError, AttributeError, OSError):
            detail = ""
        hint = ""
        if exc.code == 401 and not token:
            hint = ("; no token was sent: set ASSAYWATCH_API_TOKEN or give the monitor's "
                    "--state-dir")
        raise usage_error(f"the monitor at {args.url} answered {exc.code}"
                          f"{': ' + detail if detail else ''}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise usage_error(f"cannot reach the monitor at {args.url}: {exc}") from None
