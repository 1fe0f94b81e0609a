#!/usr/bin/env bash
# Installs the server binaries that tests start for themselves (PostgreSQL).
# Tests start and stop their own throwaway servers from these binaries on loopback.
set -euo pipefail
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
if ((${#need[@]})); then
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
