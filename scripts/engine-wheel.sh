#!/usr/bin/env bash
# Installs the embedded engine (llama-cpp-python) into a venv from a wheel built with portable CPU
# flags, keyed by those flags.
#
# pip's own wheel cache is keyed by the source archive alone and ignores CMAKE_ARGS, so a machine
# that once built llama.cpp with native flags would keep that binary forever (and a native build
# segfaults on CPUs with AMX, llama.cpp issue 20824). Here the wheel lives in a folder named by a
# digest of the version and the flags: change either and the engine is rebuilt; keep both and a
# fresh clone on the same machine installs it in seconds.
#
# usage: scripts/engine-wheel.sh [--rebuild] VENV_PYTHON VERSION CMAKE_ARGS...
#   --rebuild: build again even if a wheel for these flags is cached (`make engine-rebuild`)
set -euo pipefail
rebuild=false
if [[ ${1:-} == --rebuild ]]; then rebuild=true; shift; fi
py=$1 version=$2
shift 2
cmake_args="$*"
key=$(printf '%s\n%s\n%s\n' "$version" "$cmake_args" "$("$py" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())')" | sha256sum | cut -c1-16)
dir="${GPUPLANE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuplane/wheels}/llama-cpp-python-$version-$key"
wheel=$(ls "$dir"/llama_cpp_python-*.whl 2>/dev/null | head -n 1 || true)
$rebuild && wheel=""
if [[ -z $wheel ]]; then
    echo "building llama.cpp $version with CMAKE_ARGS=\"$cmake_args\" (about 8 minutes on 2 cores, once per machine)"
    tmp=$(mktemp -d "${dir}.tmp.XXXXXX" 2>/dev/null || { mkdir -p "$(dirname "$dir")" && mktemp -d "${dir}.tmp.XXXXXX"; })
    CMAKE_ARGS="$cmake_args" "$py" -m pip wheel --quiet --no-deps --no-cache-dir \
        --no-binary llama-cpp-python -w "$tmp" "llama-cpp-python==$version"
    rm -rf "$dir" && mv "$tmp" "$dir"  # a build cut short leaves no half-written wheel behind
    wheel=$(ls "$dir"/llama_cpp_python-*.whl | head -n 1)
fi
"$py" -m pip install --quiet --force-reinstall --no-deps "$wheel"
# its dependencies, the server extra's included, come from uv.lock (make setup)
