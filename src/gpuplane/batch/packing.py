"""The packing planner (pure): which modules share which device, and how many replicas each gets.

Input: each module's declared `Slice` and measured seconds per clip, and the devices. Heavy
modules (share >= `heavy_share`, or whole cards) get devices to themselves; light ones are
packed best-fit by compute share and memory. Replicas are then added by water-filling: the
module with the lowest rate (replicas / seconds per clip) gets one more replica while one fits,
so that stages run at matching rates and the plan's throughput is its slowest module's rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuplane.errors import ResourceError
from gpuplane.resources import Slice

CPU = "cpu"
"""The device name of modules that declare no GPU share."""


@dataclass(frozen=True, slots=True)
class BatchDevice:
    """One (declared or real) GPU card."""

    id: str
    mem_mib: int = 81920


@dataclass(frozen=True, slots=True)
class ModuleProfile:
    name: str
    slice: Slice
    seconds_per_clip: float


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica of a module (its `index`-th) on one device, or on the host CPUs, with its
    card share."""

    module: str
    index: int
    device: str
    share: float
    mem_mib: int

    def to_dict(self) -> dict[str, object]:
        """As run.json and `batch plan -o json` show it (the index under `replica`)."""
        return {"module": self.module, "replica": self.index, "device": self.device,
                "share": self.share, "mem_mib": self.mem_mib}  # fmt: skip


@dataclass(frozen=True, slots=True)
class PackingPlan:
    replicas: tuple[Replica, ...]
    replica_counts: Mapping[str, int]
    rates: Mapping[str, float]  # clips per second per module
    bottleneck: str
    device_load: Mapping[str, float]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def throughput(self) -> float:
        return self.rates[self.bottleneck]

    def replicas_of(self, module: str) -> tuple[Replica, ...]:
        return tuple(r for r in self.replicas if r.module == module)

    def share_of(self, module: str) -> float:
        rs = self.replicas_of(module)
        return rs[0].share if rs else 0.0

    def to_dict(self) -> dict[str, object]:
        """As run.json and `batch plan -o json` show it: valid JSON, so an unbounded rate (a
        module measured at 0 s per clip, e.g. one served wholly from cache) is null, with a note."""
        unbounded = [n for n, r in self.rates.items() if math.isinf(r)]
        notes = [*self.notes, *(f"{n}: rate unbounded (0 s per clip expected), shown as null"
                                for n in unbounded)]  # fmt: skip
        return {
            "replicas": dict(self.replica_counts),
            "rates": {n: None if n in unbounded else r for n, r in self.rates.items()},
            "bottleneck": self.bottleneck,
            "device_load": dict(self.device_load),
            "placements": [r.to_dict() for r in self.replicas],
            "notes": notes,
        }


@dataclass(slots=True)
class _Devices:
    devices: Sequence[BatchDevice]
    load: dict[str, float]
    mem: dict[str, int]
    exclusive: set[str]

    def choose(self, sl: Slice, heavy_share: float) -> tuple[str, float, int] | None:
        """Best fit for one replica: (device, share, mem) or None when nothing fits (ask)."""
        best: tuple[float, str, float, int] | None = None
        for d in self.devices:
            share = sl.share(d.mem_mib)
            mem = sl.gpu_mem_mib if sl.gpu_mem_mib is not None else int(share * d.mem_mib)
            if d.id in self.exclusive:
                continue
            if not sl.is_fractional or share >= heavy_share:
                if self.load[d.id] > 0:
                    continue  # heavy modules run alone
                share = 1.0
                mem = d.mem_mib
            free = 1.0 - self.load[d.id]
            if share > free + 1e-9 or mem > d.mem_mib - self.mem[d.id]:
                continue
            left = free - share
            if best is None or left < best[0]:
                best = (left, d.id, share, mem)
        return None if best is None else (best[1], best[2], best[3])

    def take(self, device: str, share: float, mem: int, exclusive: bool) -> None:
        self.load[device] += share
        self.mem[device] += mem
        if exclusive:
            self.exclusive.add(device)


def plan_packing(
    modules: Sequence[ModuleProfile],
    devices: Sequence[BatchDevice],
    *,
    heavy_share: float = 0.5,
    max_replicas: int = 16,
    max_cpu_replicas: int = 4,
    enough_rate: float = 500.0,
) -> PackingPlan:
    """Place one replica of every module, then add replicas to the bottleneck while one fits.

    Past `enough_rate` clips per second the driver and the storage are the limit, so a faster
    bottleneck gets no more replicas (they would only hold device share and, on Ray, actors).
    """
    if not modules:
        raise ResourceError("nothing to plan: the pipeline has no modules")
    if any(m.seconds_per_clip < 0 for m in modules):
        raise ResourceError("seconds per clip must be >= 0")
    multi = [m.name for m in modules if m.slice.gpus > 1]
    if multi:
        raise ResourceError(
            f"modules {multi} ask for more than one whole GPU per replica; batch stages run one "
            "card per replica: ask for gpus=1 and let the planner add replicas"
        )
    state = _Devices(devices, {d.id: 0.0 for d in devices}, {d.id: 0 for d in devices}, set())
    made: list[Replica] = []
    counts: dict[str, int] = {}
    notes: list[str] = []

    def add(m: ModuleProfile) -> bool:
        if not m.slice.is_gpu:
            if counts.get(m.name, 0) >= max_cpu_replicas:
                return False
            made.append(Replica(m.name, counts.get(m.name, 0), CPU, 0.0, 0))
            counts[m.name] = counts.get(m.name, 0) + 1
            return True
        if counts.get(m.name, 0) >= max_replicas:
            return False
        choice = state.choose(m.slice, heavy_share)
        if choice is None:
            return False
        device, share, mem = choice
        state.take(device, share, mem, exclusive=share >= 1.0 - 1e-9 and not m.slice.is_fractional)
        made.append(Replica(m.name, counts.get(m.name, 0), device, share, mem))
        counts[m.name] = counts.get(m.name, 0) + 1
        return True

    # heaviest first, so whole cards are still free for the modules that need them
    order = sorted(modules, key=lambda m: -_nominal_share(m.slice, devices))
    for m in order:
        if not add(m):
            free = {d: round(1 - v, 3) for d, v in state.load.items()}
            raise ResourceError(
                f"module {m.name!r} ({_describe(m.slice)}) does not fit on the devices "
                f"(free share per device: {free}); declare more devices or shrink its slice"
            )

    def rate(m: ModuleProfile) -> float:
        n = counts[m.name]
        return math.inf if m.seconds_per_clip <= 0 else n / m.seconds_per_clip

    while True:
        slowest = min(modules, key=rate)
        if rate(slowest) >= enough_rate:
            notes.append(f"every module runs at >= {enough_rate:g} clips/s")
            break
        if not add(slowest):
            notes.append(f"{slowest.name} sets the pace: no room for another replica")
            break
    rates = {m.name: rate(m) for m in modules}
    bottleneck = min(modules, key=rate).name
    load = {d: round(v, 6) for d, v in state.load.items()}
    return PackingPlan(tuple(made), dict(counts), rates, bottleneck, load, tuple(notes))


def _nominal_share(sl: Slice, devices: Sequence[BatchDevice]) -> float:
    if not sl.is_gpu:
        return -1.0
    return sl.share(devices[0].mem_mib) if devices else float(sl.gpus)


def _describe(sl: Slice) -> str:
    if not sl.is_gpu:
        return "cpu"
    if not sl.is_fractional:
        return f"{sl.gpus} GPU"
    return f"{sl.gpu_mem_mib} MiB, {sl.gpu_cores_pct}% cores"


def declared_devices(count: int, mem_mib: int = 81920) -> tuple[BatchDevice, ...]:
    """A declared inventory for machines without GPUs (`--gpus N`)."""
    if count < 1:
        raise ResourceError(f"declare at least one device, got {count}")
    return tuple(BatchDevice(f"gpu{i}", mem_mib) for i in range(count))
