#!/usr/bin/env bash
# Runs the test suite against the newest releases that pyproject.toml's ranges allow, not the
# lock, in a venv of its own (.venv-latest), and lists which packages differ from uv.lock: what
# breaks here is what the next `make lock` would bring. It never changes uv.lock.
#
# usage: scripts/test-latest.sh PYTHON EXTRAS ENGINE_VERSION ENGINE_CMAKE_ARGS... (`make test-latest`)
set -euo pipefail
py=$1 extras=$2 engine_version=$3
shift 3
venv=.venv-latest
"$py" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade uv
uv=(env "VIRTUAL_ENV=$venv" "$venv/bin/uv")
# the engine first, from the same cached build as make setup: the resolver below then keeps it
# (pyproject pins it exactly) instead of compiling its source archive with native flags
scripts/engine-wheel.sh "$venv/bin/python" "$engine_version" "$@"
"${uv[@]}" pip install --quiet --upgrade -e ".[$extras]"
"${uv[@]}" pip install --quiet --no-deps --require-hashes -r requirements/no-deps.txt
echo "== packages newer than uv.lock (name: locked -> installed)"
"${uv[@]}" export --frozen --all-extras --no-hashes --no-emit-project --no-header 2>/dev/null \
    | sed -n 's/^\([A-Za-z0-9_.-]*\)==\([^ ;]*\).*/\1 \2/p' | sort -u >"$venv/locked.txt"
"${uv[@]}" pip freeze | sed -n 's/^\([A-Za-z0-9_.-]*\)==\(.*\)/\1 \2/p' | sort -u >"$venv/installed.txt"
join -i "$venv/locked.txt" "$venv/installed.txt" | awk '$2 != $3 {print "  " $1 ": " $2 " -> " $3}'
echo "== the suite against them"
# shellcheck disable=SC2086  # PYTEST_ARGS: extra pytest words, e.g. "-m 'not slow' -x"
"$venv/bin/python" -m pytest ${PYTEST_ARGS:-}
