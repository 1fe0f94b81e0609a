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
echo "== packages whose newest release differs from uv.lock (name: locked -> installed)"
"${uv[@]}" export --frozen --all-extras --no-hashes --no-emit-project --no-header >"$venv/locked.txt"
"$venv/bin/python" - "$venv/locked.txt" <<'PY'
import sys
from importlib import metadata

from packaging.requirements import Requirement

for line in open(sys.argv[1]):  # a universal lock: keep the pins whose markers hold here
    if not line.strip() or line.lstrip().startswith(("#", "-")):
        continue
    req = Requirement(line.strip())
    if req.marker is not None and not req.marker.evaluate():
        continue
    locked = next(iter(req.specifier)).version
    try:
        installed = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        continue
    if installed != locked:
        print(f"  {req.name}: {locked} -> {installed}")
PY
echo "== the suite against them"
# shellcheck disable=SC2086  # PYTEST_ARGS: pytest's words (make test-latest: its workers)
"$venv/bin/python" -m pytest ${PYTEST_ARGS:-}
