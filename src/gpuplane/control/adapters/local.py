"""The `local` adapter: runs each job as a process on this machine, with its devices in env.

Inventory: this machine's GPUs from `nvidia-smi`; on a machine without one (or with
`discover_gpus: false`), the nodes declared in the cluster's config, or else the embedded default
of two 80 GiB cards. A job gets `CUDA_VISIBLE_DEVICES` (its card indices) and, for a vGPU slice,
HAMi's environment: `CUDA_DEVICE_MEMORY_LIMIT` (e.g. `10240m`) and `CUDA_DEVICE_SM_LIMIT` (its
compute share in percent). Output goes to a log file per job; the exit code is the job's. A job
with a time limit that is still running once it has run that long (from its start here) is
reported TIMED_OUT by `status`; the service then records why and `release` stops it.

Least privilege (`_privilege.py`, `_isolation.py`): a job's environment is its spec's `env`,
the GPU variables, a minimal PATH, HOME and LANG/TZ, never the service's, and it reaches the
job's own process only (its wrapper, root, runs in a fixed environment); it runs in a directory
of its own (its HOME, mode 0700, owned by its user, removed at release) unless its spec names a
`workdir`; a service running as root starts it as its team's own uid (or `control.job_user`;
root only with `control.allow_root_jobs`), while its wrapper stays root to write the exit file
into the state dir, which the job cannot enter. Where teams share one user, a second team's job
is refused while another's run (unless `control.allow_shared_job_user`). Each job has a cgroup
v2 of its own (`_cgroup.py`: memory and CPU limits, and every descendant killed at release),
or, where none can be made, a subreaper wrapper.

Jobs outlive the service (`procs.py`): each runs in a session of its own under a wrapper that
records its exit code, and its pid and start time are recorded before it starts, in
`<state_dir>/clusters/<cluster>/run/`. A restarted service of the same `control.service_id` loads
those records at first use: `bind` takes such a job back instead of starting it again, `status`
reports it running, ended with its code, or lost, and `release` stops it. Per-job files rather
than store columns: pids and start times mean something only to this adapter on this machine, and
the adapter interface stays the same for backends that keep that state themselves (a Pod, a Ray
task).

Drills (`lab/faults.py`) inject the failures a local cluster cannot have on its own:
`kill` a job's processes (an engine crash) and `lose` the cluster (its machine gone: every job
killed, and the adapter answers nothing for a while, so the service marks it unreachable).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from typing import ClassVar

from gpuplane.control.adapters import _cgroup
from gpuplane.control.adapters._isolation import FIX_PYTHON, JobIsolation
from gpuplane.control.adapters._privilege import job_env, make_home, remove_home
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
from gpuplane.control.adapters.procs import FIX, JobProcess, RunDir
from gpuplane.control.logtail import read_log
from gpuplane.control.spec import format_duration
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_REGION, LABEL_VGPU

# a deployment instance's engine listens here: the jobs run on this machine
ENGINE_HOST = "127.0.0.1"

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


def _placement(workload: Workload) -> dict[str, str]:
    return {"node": workload.node, **hami_env(workload)}


@register
class LocalAdapter(ClusterAdapter):
    """Processes on this machine; one node (this host) unless nodes are declared."""

    kind: ClassVar[str] = "local"
    unsupported: ClassVar[dict[str, str]] = {
        "gpu isolation": "limits are passed in env (HAMi names); nothing enforces them locally",
    }

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._dir = RunDir(self.state_dir / "run")
        # refused here, at start, when the settings cannot hold on this machine
        self._isolation = JobIsolation(self.cluster.name, self.control)
        self._runs: dict[str, JobProcess] | None = None  # loaded from the records at first use
        self._lock = threading.Lock()
        self._lost_until = float("-inf")  # time.monotonic() until which a drill lost it

    # -- inventory ---------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        up, why = self.reachable()
        if not up:
            raise AdapterError(f"cluster {self.cluster.name}: {why}")
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
        """Start `workload`, or take back the one an earlier process of this service started for
        the same job on the same placement (on another one it is stopped and started afresh)."""
        with self._lock:
            held = self._held().get(workload.job_id)
        if held is not None:
            if held.record.placement == _placement(workload):
                return
            self.release(workload.job_id)
        with self._lock:
            runs = self._held()
            if workload.job_id not in runs:
                teams = (run.record.team for run in runs.values())
                if (why := self._isolation.refusal(workload.team, teams)) is not None:
                    raise AdapterError(why)
                runs[workload.job_id] = self._start(workload)

    def status(self, job_ids: Iterable[str]) -> dict[str, WorkloadStatus]:
        with self._lock:
            runs = self._held()
            return {job_id: self._status(job_id, runs.get(job_id)) for job_id in job_ids}

    def release(self, job_id: str) -> None:
        with self._lock:
            run = self._held().pop(job_id, None)
        if run is None:
            return
        run.stop(self.control.kill_grace_s)
        self._dir.forget(job_id)
        remove_home(run.record.home)

    def workloads(self) -> list[str]:
        with self._lock:
            return list(self._held())

    # -- records -------------------------------------------------------------------------------

    def _held(self) -> dict[str, JobProcess]:
        """The workloads this adapter holds; at first use, those an earlier process of this
        service process recorded (call under the lock)."""
        if self._runs is None:
            self._runs = self._dir.load(self.control.service_id)
        return self._runs

    def _status(self, job_id: str, run: JobProcess | None) -> WorkloadStatus:
        if run is None:
            return WorkloadStatus(
                WorkloadState.LOST, None, "the local adapter has no record of its process"
            )
        record = run.record
        ended = self._dir.exit(job_id)
        if ended is None and run.alive():
            if record.limit_s is not None and time.monotonic() - record.started >= record.limit_s:
                return WorkloadStatus(
                    WorkloadState.TIMED_OUT,
                    None,
                    f"exceeded its time limit: still running after "
                    f"{format_duration(record.limit_s)} on this node; stopped",
                )
            return WorkloadStatus(WorkloadState.RUNNING)
        ended = ended or self._dir.exit(job_id)  # it may have ended between the two looks
        if ended is None:
            return WorkloadStatus(
                WorkloadState.LOST,
                None,
                f"its wrapper (pid {record.pid}) is gone without recording an exit code: it "
                "was killed (with the job, or alone: what is left of the job is stopped)",
            )
        if ended.error is not None:
            return WorkloadStatus(WorkloadState.FAILED, ended.code, f"{ended.error}; {FIX}")
        if ended.code == 0:
            return WorkloadStatus(WorkloadState.SUCCEEDED, 0)
        return WorkloadStatus(WorkloadState.FAILED, ended.code, _describe_exit(ended.code))

    def _start(self, workload: Workload) -> JobProcess:
        if not workload.command:
            raise AdapterError(f"job {workload.job_id} has an empty command")
        user = self._isolation.user(workload.team)
        home = make_home(workload.job_id, user)
        gpu_env = {
            **hami_env(workload),
            "GPUPLANE_JOB_ID": workload.job_id,
            "GPUPLANE_JOB_NAME": workload.name,
        }
        cgroup = None
        try:
            cgroup = self._isolation.cgroup(workload)
            return self._dir.start(
                workload.job_id,
                workload.command,
                job_env(workload.env, gpu_env, home, os.environ),
                workload.workdir or home,
                self.log_path(workload.job_id),
                service_id=self.control.service_id,
                limit_s=workload.time_limit_s,
                placement=_placement(workload),
                user=user,
                home=home,
                team=workload.team,
                cgroup=cgroup,
            )
        except AdapterError:
            remove_home(home)
            if cgroup is not None:
                _cgroup.kill(cgroup)
                _cgroup.remove(cgroup)
            raise

    def logs(self, job_id: str, tail: int | None = None, since: int = 0) -> Iterator[bytes]:
        return read_log(self.log_path(job_id), tail, since=since)

    def close(self) -> None:
        for job_id in self.workloads():
            self.release(job_id)

    def serving_refusal(self) -> str | None:
        """None: an instance's engine listens on this machine's loopback; refused while the
        job user cannot run the Python of the instance's command."""
        if (no_python := self._isolation.no_python) is None:
            return None
        return f"{no_python}, which an instance's engine runs in; {FIX_PYTHON}"

    def instance_url(self, job_id: str, port: int) -> str | None:
        return f"http://{ENGINE_HOST}:{port}"

    def reachable(self) -> tuple[bool, str]:
        left = self._lost_until - time.monotonic()
        if left > 0:
            return False, f"lost by a drill: its machine answers nothing for {left:.0f} s more"
        return True, ""

    # -- drills ------------------------------------------------------------------------------

    def kill(self, job_id: str) -> None:
        """SIGKILL the job's processes, as an engine crash would; `status` then reports it
        lost. Unknown or ended: nothing to do."""
        with self._lock:
            run = self._held().get(job_id)
        if run is not None:
            run.kill()

    def lose(self, for_s: float) -> list[str]:
        """This cluster's machine is gone for `for_s` seconds: every job it runs is killed
        (SIGKILL, as a power loss would) and until then `reachable()` says no and `inventory()`
        raises. Returns the jobs killed; their records stay, so once the cluster answers again
        the service finds them lost, or stops what it re-placed elsewhere meanwhile."""
        with self._lock:
            self._lost_until = time.monotonic() + for_s
            runs = list(self._held().items())
        for _, run in runs:
            run.kill()
        return [job_id for job_id, _ in runs]


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
