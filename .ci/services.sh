#!/usr/bin/env bash
# Installs the server binaries that tests start for themselves: PostgreSQL, Redis and etcd (lease
# stores), Prometheus (dashboard queries), Chromium (browser tests) and kubectl (driven against
# the fake Kubernetes API server). Tests start and stop their own throwaway servers from these
# binaries on loopback; nothing here starts a service.
set -euo pipefail
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null || need+=(redis-server)
command -v etcd >/dev/null || need+=(etcd-server)
command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
command -v kubectl >/dev/null || need+=(kubernetes-client)
if ((${#need[@]})); then
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
