"""A Ray job for a workload, and its state: the pure half of the `ray` adapter (`ray.py`).

`ray_request` is the Job Submission REST body (`POST /api/jobs/`) that pins a workload to its
node; `job_status` reads a job's details back as the workload's state; `own_output` strips the
lines Ray's job manager writes into a job's log.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from gpuplane.control.adapters.base import Workload, WorkloadState, WorkloadStatus
from gpuplane.control.adapters.local import hami_env
from gpuplane.control.spec import format_duration

GPU_MEM = "gpu_mem_mib"  # the custom resource: MiB of GPU memory on the node
MIB = 1024 * 1024
META_PLACEMENT = "gpuplane.io/placement"
META_LIMIT = "gpuplane.io/time-limit-s"


def placement_of(workload: Workload) -> str:
    """What makes two binds of one job the same: its node and its devices (as metadata)."""
    grants = [[d.index, d.mem_mib, d.gpu_milli] for d in workload.devices]
    return json.dumps({"node": workload.node, "devices": grants}, sort_keys=True)


def ray_request(workload: Workload, selector: dict[str, str], has_gpu_mem: bool) -> dict[str, Any]:
    """The job-submission body (Ray's REST `POST /api/jobs/`) for `workload` on its node."""
    devices = workload.devices
    if workload.fractional and devices:
        num_gpus = devices[0].gpu_milli / 1000
    else:
        num_gpus = float(len(devices))
    env = {k: v for k, v in hami_env(workload).items() if k != "CUDA_VISIBLE_DEVICES"}
    env = {**workload.env, **env, "GPUPLANE_JOB_ID": workload.job_id}
    env["GPUPLANE_JOB_NAME"] = workload.name
    entrypoint = shlex.join(workload.command)
    if workload.workdir:
        entrypoint = f"cd {shlex.quote(workload.workdir)} && {entrypoint}"
    body: dict[str, Any] = {
        "entrypoint": entrypoint,
        "submission_id": workload.job_id,
        "entrypoint_num_cpus": workload.cpu_millis / 1000,
        "entrypoint_num_gpus": num_gpus,
        "entrypoint_label_selector": selector,
        "runtime_env": {"env_vars": env},
        "metadata": {META_PLACEMENT: placement_of(workload)},
    }
    if workload.memory_mib:
        body["entrypoint_memory"] = workload.memory_mib * MIB
    mem = sum(d.mem_mib for d in devices)
    if has_gpu_mem and mem:
        body["entrypoint_resources"] = {GPU_MEM: float(mem)}
    if workload.time_limit_s is not None:
        body["metadata"][META_LIMIT] = repr(workload.time_limit_s)
    return body


def job_status(info: dict[str, Any], now: float) -> WorkloadStatus:
    """A Ray job's details (`GET /api/jobs/{id}`) as the workload's state, at wall time `now`."""
    state = info.get("status")
    if state in ("PENDING", "RUNNING"):
        limit = (info.get("metadata") or {}).get(META_LIMIT)
        start = info.get("start_time")
        if limit is not None and start and now - start / 1000 >= float(limit):
            return WorkloadStatus(
                WorkloadState.TIMED_OUT,
                None,
                f"exceeded its time limit: still running after "
                f"{format_duration(float(limit))} on this node; stopped",
            )
        return WorkloadStatus(WorkloadState.RUNNING)
    code = info.get("driver_exit_code")
    if state == "SUCCEEDED":
        return WorkloadStatus(WorkloadState.SUCCEEDED, 0)
    if state == "STOPPED":
        return WorkloadStatus(
            WorkloadState.FAILED, code, "stopped in Ray outside gpuplane (`ray job stop`?)"
        )
    first = str(info.get("message") or "").split("\n", 1)[0][:300]
    if code is not None and info.get("error_type") == "JOB_ENTRYPOINT_COMMAND_ERROR":
        why = f"exited with code {code}"
        if code == 127:
            why += f" (a command not found on the node: {first})"
        return WorkloadStatus(WorkloadState.FAILED, code, why)
    return WorkloadStatus(
        WorkloadState.FAILED, code, f"Ray failed it ({info.get('error_type')}): {first}"
    )


def own_output(job_id: str, logs: str) -> bytes:
    """The job's output without the lines Ray's job manager writes into it (`... INFO
    job_manager.py:... -- Runtime env is setting up.`, `Running entrypoint for job <id>: ...`;
    not always first: they are written by another process than the command's)."""
    ours = re.compile(
        rf"^(\d{{4}}-\d\d-\d\d [\d:,]+\tINFO job_manager\.py:\d+ -- |"
        rf"Running entrypoint for job {re.escape(job_id)}: )"
    )
    kept = [line for line in logs.splitlines(keepends=True) if not ours.match(line)]
    return "".join(kept).encode(errors="replace")
