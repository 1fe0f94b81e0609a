"""Per-process GPU usage from NVML, attributed to workloads through their process ids.

`read_answer()` (the I/O edge; `nvidia-ml-py` imported on first use) asks NVML, per card, for
its memory (`nvmlDeviceGetMemoryInfo`), utilisation (`nvmlDeviceGetUtilizationRates`), the
compute processes with their memory (`nvmlDeviceGetComputeRunningProcesses`) and the per-process
SM utilisation samples since the last pass (`nvmlDeviceGetProcessUtilization`), and returns them
as JSON-able data whose keys are pynvml's struct fields (bytes, percent, microseconds): the
recorded answers in the tests have exactly this shape.

`samples()` (pure) turns one answer into one sample per (card, workload): the memory of the
workload's processes summed, and its share of the card's SMs as the mean of its processes'
`smUtil` samples in the window (summed over its processes; a listed process with no sample
did no compute). A process belongs to the job whose recorded process leads its session (the
local adapter starts every job as a session leader and records its pid and start time,
`control/adapters/procs.py`); a process no job claims is the workload `pid:<pid>`. A card with
no process is one sample with no workload, its device memory and utilisation as usage.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from gpuplane.audit.collect import CollectError
from gpuplane.audit.samples import Sample, to_table
from gpuplane.control.adapters.procs import JobRecord, process_start

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Owner:
    """The workload a process belongs to, and its slice where known."""

    workload: str
    team: str = ""
    kind: str = ""
    alloc_mem_mib: int | None = None
    alloc_cores_pct: int | None = None


# pid -> its workload, or None when no workload claims it
Resolve = Callable[[int], Owner | None]


def samples(
    answer: Mapping[str, Any], now: datetime, cluster: str, node: str, resolve: Resolve
) -> pa.Table:
    """One NVML answer (`read_answer`'s shape) as sample rows at `now`."""
    rows: list[Sample] = []
    for dev in answer["devices"]:
        card_mem = int(dev["memory"]["total"] // MIB)
        base = {
            "time": now,
            "cluster": cluster,
            "node": node,
            "card": dev.get("uuid") or f"{node}/{dev['index']}",
            "gpu_model": dev.get("name", ""),
            "card_mem_mib": card_mem,
        }
        util: dict[int, list[int]] = {}
        for s in dev.get("process_utilization") or []:
            util.setdefault(int(s["pid"]), []).append(int(s["smUtil"]))
        usage: dict[str, tuple[Owner, float | None, float]] = {}
        for proc in dev.get("processes") or []:
            pid = int(proc["pid"])
            owner = resolve(pid) or Owner(f"pid:{pid}")
            used = proc.get("usedGpuMemory")  # None: NVML_VALUE_NOT_AVAILABLE
            sm = util.get(pid, [])
            _, mem, share = usage.get(owner.workload, (owner, 0.0, 0.0))
            usage[owner.workload] = (
                owner,
                None if mem is None or used is None else mem + used / MIB,
                share + (sum(sm) / len(sm) / 100 if sm else 0.0),
            )
        if not usage:
            rows.append(
                Sample(
                    **base,
                    mem_used_mib=min(dev["memory"]["used"] / MIB, card_mem),
                    compute_share=dev["utilization"]["gpu"] / 100,
                )
            )
        for owner, mem, share in usage.values():
            rows.append(
                Sample(
                    **base,
                    workload=owner.workload,
                    team=owner.team,
                    kind=owner.kind,
                    alloc_mem_mib=owner.alloc_mem_mib,
                    alloc_cores_pct=owner.alloc_cores_pct,
                    mem_used_mib=None if mem is None else min(mem, card_mem),
                    compute_share=min(share, 1.0),
                )
            )
    return to_table(rows)


def session_of(pid: int) -> int | None:
    """The session id of process `pid` (field 6 of /proc/<pid>/stat); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[3])


def run_dir_resolver(run_dir: Path, sessions: Callable[[int], int | None] = session_of) -> Resolve:
    """Processes to jobs through the local adapter's job records in `run_dir`: a process
    belongs to the job whose recorded process (same pid and start time) leads its session. The
    slice comes from the HAMi limits the job was started with."""
    leaders: dict[int, Owner] = {}
    for path in sorted(run_dir.glob("*.json")):  # every service instance's jobs
        try:
            record = JobRecord.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            continue  # being replaced, or not a job record
        if process_start(record.pid) != record.start_time:
            continue  # that job has ended; its pid may belong to someone else now
        env = record.placement
        mem = env.get("CUDA_DEVICE_MEMORY_LIMIT", "")
        cores = env.get("CUDA_DEVICE_SM_LIMIT")
        leaders[record.pid] = Owner(
            record.job_id,
            kind="batch",
            alloc_mem_mib=int(mem.removesuffix("m")) if mem.endswith("m") else None,
            alloc_cores_pct=int(cores) if cores else None,
        )

    def resolve(pid: int) -> Owner | None:
        sid = sessions(pid)
        return None if sid is None else leaders.get(sid)

    return resolve


class Reader:
    """The I/O edge: NVML's answer for every card on this machine, one pass at a time."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise CollectError(
                "the NVML collector needs nvidia-ml-py: pip install 'gpuplane[audit]'"
            ) from None
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise CollectError(
                f"NVML is not available here ({exc}); run the collector on a machine with an "
                "NVIDIA driver, or collect through Prometheus (--source prometheus)"
            ) from None
        self._last_seen_us = 0

    def answer(self) -> dict[str, Any]:
        """Every card's memory, utilisation, processes and utilisation samples since the last
        call, keyed by pynvml's struct fields."""
        nv = self._nvml
        devices = []
        newest = self._last_seen_us
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                mem = nv.nvmlDeviceGetMemoryInfo(handle)
                rates = nv.nvmlDeviceGetUtilizationRates(handle)
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
                try:
                    util = nv.nvmlDeviceGetProcessUtilization(handle, self._last_seen_us)
                except nv.NVMLError:  # NOT_FOUND: no process ran a kernel since then
                    util = []
                newest = max([newest, *(int(s.timeStamp) for s in util)])
                devices.append(
                    {
                        "index": index,
                        "uuid": _text(nv.nvmlDeviceGetUUID(handle)),
                        "name": _text(nv.nvmlDeviceGetName(handle)),
                        "memory": {"total": mem.total, "free": mem.free, "used": mem.used},
                        "utilization": {"gpu": rates.gpu, "memory": rates.memory},
                        "processes": [_fields(p, _PROC_FIELDS) for p in procs],
                        "process_utilization": [_fields(s, _UTIL_FIELDS) for s in util],
                    }
                )
        except nv.NVMLError as exc:
            raise CollectError(f"NVML refused a query: {exc}") from None
        self._last_seen_us = newest
        return {"driver": _text(nv.nvmlSystemGetDriverVersion()), "devices": devices}

    def close(self) -> None:
        """Idempotent."""
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None


_PROC_FIELDS = ("pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId")
_UTIL_FIELDS = ("pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil")


def _fields(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(obj, n, None) for n in names}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def default_node() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()
