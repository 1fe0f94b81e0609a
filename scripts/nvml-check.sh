#!/usr/bin/env bash
# The NVML collector on a real GPU machine, in one command: one pass of
# `gpuplane audit collect --source nvml`, NVML's answer recorded as JSON (the shape of the
# fixtures in tests/audit/nvml/), and the samples it stored printed back.
#   scripts/nvml-check.sh [OUT_DIR] [--run-dir <control.state_dir>/clusters/<cluster>/run]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
shift || true
py=".venv/bin/python"
[ -x "$py" ] || py=python3
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu --format=csv
"$py" -m gpuplane.cli.main audit collect --source nvml --once --out "$out/samples" \
    --record "$out/nvml-answer.json" "$@"
"$py" - "$out" <<'PY'
import sys
from gpuplane.audit.samples import SampleStore
table = SampleStore(sys.argv[1] + "/samples").scan()
cols = ["card", "workload", "card_mem_mib", "mem_used_mib", "compute_share"]
for row in table.select(cols).to_pylist():
    print(row)
print(f"{table.num_rows} samples; NVML's answer is in {sys.argv[1]}/nvml-answer.json")
PY
