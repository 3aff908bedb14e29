#!/usr/bin/env bash
# Create the conformance recording environments (tests/conformance/README.md):
#
#   bash tests/conformance/setup_envs.sh [DIR]
#
#   DIR/env-a          requirements.txt              pinned: every scenario but otel_openai_v2_*
#   DIR/env-b          requirements-openai-v2.txt    pinned: otel_openai_v2_*
#   DIR/env-latest     requirements-latest.txt       newest releases within the pinned major
#                                                    versions: the CI re-record subset
#   DIR/env-latest-v2  requirements-latest-openai-v2.txt   same, for otel_openai_v2_bare
#
# DIR defaults to $ASSAYWATCH_CONFORMANCE_ENVS, else ~/.cache/assaywatch/conformance-envs.
# Idempotent: an environment whose requirements file (and interpreter version) did not
# change since it was built is kept; a "latest" environment is also rebuilt when it is
# older than ASSAYWATCH_CONFORMANCE_LATEST_MAX_AGE_H hours (default 24), so new releases
# reach it. PYTHON chooses the interpreter (default python3). Never touches the project's
# own .venv. Prints the time each environment and the whole run took.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-${ASSAYWATCH_CONFORMANCE_ENVS:-$HOME/.cache/assaywatch/conformance-envs}}
python=${PYTHON:-python3}
max_age_h=${ASSAYWATCH_CONFORMANCE_LATEST_MAX_AGE_H:-24}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

mkdir -p "$dir"
py_version=$("$python" -c 'import sys; print(sys.version.split()[0])')
t_all=$(date +%s.%N)

elapsed() {  # seconds since $1, one decimal
    awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}

build() {  # build NAME REQUIREMENTS [latest]
    local name=$1 req=$here/$2 latest=${3:-} env=$dir/$1
    local stamp=$env/.assaywatch-requirements.sha256
    local want
    want=$( { cat "$req"; echo "python $py_version"; } | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$env/bin/python" ] \
            && "$env/bin/python" -c 'import opentelemetry.sdk' 2>/dev/null; then
        local age_h=$(( ( $(date +%s) - $(stat -c %Y "$stamp") ) / 3600 ))
        if [ -z "$latest" ] || [ "$age_h" -lt "$max_age_h" ]; then
            echo "kept    $name ($2 unchanged)"
            return
        fi
        echo "refresh $name (built ${age_h} h ago; newer releases may exist)"
    fi
    local t0
    t0=$(date +%s.%N)
    rm -rf "$env"
    "$python" -m venv "$env"
    # a current pip: the bundled one's resolver gives up on requirements-latest.txt
    if ! "$env/bin/python" -m pip install -q --upgrade pip \
            || ! "$env/bin/python" -m pip install -q -r "$req"; then
        echo "FAILED  $name: pip install -r $2" >&2
        rm -rf "$env"
        return 1
    fi
    echo "$want" > "$stamp"  # last: an interrupted build is rebuilt next time
    echo "built   $name from $2 in $(elapsed "$t0") s"
}

# One after another: side by side is no faster here (the downloads share the bandwidth).
build env-a requirements.txt
build env-b requirements-openai-v2.txt
build env-latest requirements-latest.txt latest
build env-latest-v2 requirements-latest-openai-v2.txt latest
echo "conformance environments ready in $dir ($(elapsed "$t_all") s)"
