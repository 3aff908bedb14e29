#!/usr/bin/env bash
# Build assaywatch's OpenTelemetry Collector distribution (see tests/infra/README.md).
#   deploy/collector/build.sh [OUTPUT]     default: deploy/collector/bin/assaywatch-otelcol
# Needs Go >= 1.26 and the Go module proxy (modules land in the usual GOMODCACHE, outside
# the repository). Skips the build when OUTPUT is newer than every source file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/bin/assaywatch-otelcol}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac

if [ -x "$out" ] && [ -z "${ASSAYWATCH_OTELCOL_REBUILD:-}" ] \
        && [ -z "$(find "$here" -maxdepth 1 \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) -newer "$out")" ]; then
    echo "up to date: $out"
    exit 0
fi

mkdir -p "$(dirname "$out")"
cd "$here"
# -mod=readonly: go.mod and go.sum are complete (`go mod tidy -e`, see README); a build
# never rewrites them. CGO off: a static binary that runs on any Linux of this arch.
CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false" \
    go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out" .
echo "built: $out ($(du -h "$out" | cut -f1))"
