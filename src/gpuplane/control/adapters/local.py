"""The `local` adapter: runs each job as a process on this machine, with its devices in env.

Inventory: this machine's GPUs from `nvidia-smi`; on a machine without one (or with
`discover_gpus: false`), the nodes declared in the cluster's config, or else the embedded default
of two 80 GiB cards. A job gets `CUDA_VISIBLE_DEVICES` (its card indices) and, for a vGPU slice,
HAMi's environment: `CUDA_DEVICE_MEMORY_LIMIT` (e.g. `10240m`) and `CUDA_DEVICE_SM_LIMIT` (its
compute share in percent). Output goes to a log file per job; the exit code is the job's. A job
with a time limit that is still running once it has run that long (from its start here) is
reported TIMED_OUT by `status`; the service then records why and `release` stops it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, ClassVar

from gpuplane.control.adapters.base import (
    AdapterError,
    ClusterAdapter,
    DiscoveredDevice,
    DiscoveredNode,
    Inventory,
    Workload,
    WorkloadState,
    WorkloadStatus,
    register,
)
from gpuplane.control.logtail import read_log
from gpuplane.control.spec import format_duration
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_REGION, LABEL_VGPU

NVIDIA_SMI_QUERY = "--query-gpu=index,name,memory.total,uuid"


def parse_nvidia_smi(text: str) -> list[DiscoveredDevice]:
    """Cards from `nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,...`."""
    devices = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        model = parts[1].removeprefix("NVIDIA ").replace(" ", "-")
        uuid = parts[3] if len(parts) > 3 and parts[3] else None
        devices.append(DiscoveredDevice(int(parts[0]), model, int(float(parts[2])), uuid))
    return devices


def hami_env(workload: Workload) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` plus HAMi's per-container limits for a fractional slice."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(d.index) for d in workload.devices)}
    if workload.fractional and workload.devices:
        grant = workload.devices[0]
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{grant.mem_mib}m"
        env["CUDA_DEVICE_MEMORY_LIMIT_0"] = f"{grant.mem_mib}m"
        if grant.gpu_milli:
            env["CUDA_DEVICE_SM_LIMIT"] = str(max(1, round(grant.cores_pct)))
    return env


class _Proc:
    __slots__ = ("deadline", "limit_s", "log", "popen")

    def __init__(
        self, popen: subprocess.Popen[bytes], log: IO[bytes], limit_s: float | None
    ) -> None:
        self.popen = popen
        self.log = log
        self.limit_s = limit_s
        self.deadline = None if limit_s is None else time.monotonic() + limit_s


@register
class LocalAdapter(ClusterAdapter):
    """Processes on this machine; one node (this host) unless nodes are declared."""

    kind: ClassVar[str] = "local"
    unsupported: ClassVar[dict[str, str]] = {
        "gpu isolation": "limits are passed in env (HAMi names); nothing enforces them locally",
    }

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._procs: dict[str, _Proc] = {}
        self._lock = threading.Lock()

    # -- inventory ---------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        region = {LABEL_REGION: self.cluster.region}
        if self.cluster.discover_gpus:
            found = self._discover()
            if found:
                model = found[0].model
                node = DiscoveredNode(
                    name=socket.gethostname() or "localhost",
                    cpu_millis=(os.cpu_count() or 1) * 1000,
                    memory_mib=_host_memory_mib(),
                    labels={**region, LABEL_GPU_MODEL: model, LABEL_VGPU: "true"},
                    devices=tuple(found),
                )
                return Inventory((node,), f"nvidia-smi found {len(found)} GPU(s) ({model})")
        if self.cluster.nodes:
            nodes = []
            for declared in self.cluster.nodes:
                devices: list[DiscoveredDevice] = []
                for group in declared.gpus:
                    devices += [
                        DiscoveredDevice(len(devices) + k, group.model, group.mem_mib)
                        for k in range(group.count)
                    ]
                labels = {**region, LABEL_VGPU: "true", **declared.labels}
                if devices:
                    labels.setdefault(LABEL_GPU_MODEL, devices[0].model)
                nodes.append(
                    DiscoveredNode(
                        declared.name,
                        declared.cpu_millis,
                        declared.memory_mib,
                        labels,
                        tuple(devices),
                    )
                )
            total = sum(len(n.devices) for n in nodes)
            return Inventory(
                tuple(nodes), f"declared in config: {len(nodes)} node(s), {total} GPU(s)"
            )
        c = self.control
        devices = [
            DiscoveredDevice(i, c.default_gpu_model, c.default_gpu_mem_mib)
            for i in range(c.default_gpu_count)
        ]
        node = DiscoveredNode(
            name=socket.gethostname() or "localhost",
            cpu_millis=(os.cpu_count() or 1) * 1000,
            memory_mib=_host_memory_mib(),
            labels={**region, LABEL_GPU_MODEL: c.default_gpu_model, LABEL_VGPU: "true"},
            devices=tuple(devices),
        )
        gib = c.default_gpu_mem_mib // 1024
        return Inventory(
            (node,),
            f"no GPU found on this machine: declared {len(devices)} x {c.default_gpu_model} "
            f"({gib} GiB) so jobs can be scheduled and run as plain processes",
        )

    def _discover(self) -> list[DiscoveredDevice]:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return []
        try:
            out = subprocess.run(
                [exe, NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        return parse_nvidia_smi(out)

    # -- workloads ---------------------------------------------------------------------------

    def log_path(self, job_id: str) -> str:
        return str(self.state_dir / "logs" / f"{job_id}.log")

    def bind(self, workload: Workload) -> None:
        with self._lock:
            if workload.job_id in self._procs:
                return
            if not workload.command:
                raise AdapterError(f"job {workload.job_id} has an empty command")
            path = self.log_path(workload.job_id)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            env = {
                **os.environ,
                **workload.env,
                **hami_env(workload),
                "GPUPLANE_JOB_ID": workload.job_id,
                "GPUPLANE_JOB_NAME": workload.name,
            }
            log = open(path, "ab")  # noqa: SIM115 - owned by _Proc, closed in release
            try:
                popen = subprocess.Popen(
                    list(workload.command),
                    env=env,
                    cwd=workload.workdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                log.close()
                raise AdapterError(
                    f"job {workload.job_id}: cannot start {workload.command[0]!r}: {exc.strerror}; "
                    "check the command and workdir in the job spec"
                ) from None
            self._procs[workload.job_id] = _Proc(popen, log, workload.time_limit_s)

    def status(self, job_ids: Iterable[str]) -> dict[str, WorkloadStatus]:
        out: dict[str, WorkloadStatus] = {}
        with self._lock:
            for job_id in job_ids:
                proc = self._procs.get(job_id)
                if proc is None:
                    out[job_id] = WorkloadStatus(
                        WorkloadState.LOST, None, "the local process is gone (service restarted?)"
                    )
                    continue
                code = proc.popen.poll()
                if code is None and proc.deadline is not None and time.monotonic() >= proc.deadline:
                    assert proc.limit_s is not None
                    out[job_id] = WorkloadStatus(
                        WorkloadState.TIMED_OUT,
                        None,
                        f"exceeded its time limit: still running after "
                        f"{format_duration(proc.limit_s)} on this node; stopped",
                    )
                elif code is None:
                    out[job_id] = WorkloadStatus(WorkloadState.RUNNING)
                elif code == 0:
                    out[job_id] = WorkloadStatus(WorkloadState.SUCCEEDED, 0)
                else:
                    out[job_id] = WorkloadStatus(WorkloadState.FAILED, code, _describe_exit(code))
        return out

    def release(self, job_id: str) -> None:
        with self._lock:
            proc = self._procs.pop(job_id, None)
        if proc is None:
            return
        popen = proc.popen
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=self.control.kill_grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
        proc.log.close()

    def workloads(self) -> list[str]:
        with self._lock:
            return list(self._procs)

    def logs(self, job_id: str, tail: int | None = None) -> Iterator[bytes]:
        return read_log(self.log_path(job_id), tail)

    def close(self) -> None:
        with self._lock:
            ids = list(self._procs)
        for job_id in ids:
            self.release(job_id)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _host_memory_mib() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        return 0
