"""What the gateways report of each deployment's load, and the autoscaler's state over it.

`Loads` holds, per deployment, each gateway's last report (`POST /deployments/load`, on the
API's threads), the replicas the autoscaler wants now with when that last changed, and the
`Window` of reports over the last cooldown. The controller asks it what the gateways hold and
admit to (`held`, `ready`, `released`) and how many replicas to run (`autoscale`, whose note the
controller records as the deployment's event). It knows no store and no controller: its clock
is handed in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.control.deployments.autoscale import STALE_S, Load, Window, decide
from gpuplane.control.deployments.reconcile import Instance
from gpuplane.control.deployments.spec import DeploymentSpec


@dataclass(frozen=True, slots=True)
class Report:
    """One gateway's last load report for one model: the load, its ready instances, and the
    leases it holds per instance it still has (draining ones included)."""

    load: Load
    ready: int
    held: Mapping[str, int]
    ready_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Scaled:
    """The autoscaler's answer for one tick: the replicas wanted now, and what changed (None:
    unchanged), for the deployment's events."""

    replicas: int
    note: str | None = None


class Loads:
    """The gateways' load reports and the autoscaler's state, per deployment. Thread-safe:
    reports arrive on the API's threads while the controller reads them on its own."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._loads: dict[str, dict[str, Report]] = {}  # deployment -> gateway -> report
        self._lock = threading.Lock()
        # the replicas wanted now with when that last changed, and the reports of the cooldown
        self._scaled: dict[str, tuple[int, float | None]] = {}
        self._windows: dict[str, Window] = {}

    def report(self, gateway: str, models: Iterable[Mapping[str, Any]]) -> None:
        """A gateway's slot use per model (`POST /deployments/load`): in flight, queued, the
        oldest queued request's wait, how long it has been idle, and its ready instances."""
        now = self._clock()
        for m in models:
            load = Load(
                int(m["in_flight"]),
                int(m["queued"]),
                float(m["oldest_wait_s"]),
                now,
                float(m["idle_s"]),
            )
            held = {str(k): int(v) for k, v in m["instances"].items()}
            with self._lock:
                self._loads.setdefault(str(m["name"]), {})[gateway] = Report(
                    load, int(m["ready"]), held, tuple(str(i) for i in m["ready_ids"])
                )

    def forget(self, name: str) -> None:
        """Drop what is held of a deleted deployment. Idempotent."""
        with self._lock:
            self._loads.pop(name, None)
        self._scaled.pop(name, None)
        self._windows.pop(name, None)

    def _fresh(self, name: str, now: float) -> list[Report]:
        with self._lock:
            reports = list(self._loads.get(name, {}).values())
        return [r for r in reports if now - r.load.at <= STALE_S]

    def in_use(self, name: str, job_id: str) -> int | None:
        """Slots the reporting gateways hold on the instance (None: no gateway reports)."""
        held = self.held(name, self._clock())
        return None if held is None else held.get(job_id, 0)

    def held(self, name: str, now: float) -> dict[str, int] | None:
        """Slots the reporting gateways hold on each of `name`'s instances (None: no gateway
        reports)."""
        fresh = self._fresh(name, now)
        if not fresh:
            return None
        out: dict[str, int] = {}
        for r in fresh:
            for job_id, slots in r.held.items():
                out[job_id] = out.get(job_id, 0) + slots
        return out

    def ready(self, name: str) -> set[str] | None:
        """The instances every reporting gateway admits to (None: no gateway reports)."""
        fresh = self._fresh(name, self._clock())
        if not fresh:
            return None
        return set.intersection(*(set(r.ready_ids) for r in fresh))

    def released(self, name: str, seen: list[Instance]) -> set[str]:
        """Draining instances that every gateway reporting since the drain began no longer
        holds: each removed it at its last lease's release (or never had it)."""
        out = set()
        now = self._clock()
        for inst in seen:
            if inst.draining_since is None:
                continue
            since = [r for r in self._fresh(name, now) if r.load.at > inst.draining_since]
            if since and all(inst.job_id not in r.held for r in since):
                out.add(inst.job_id)
        return out

    def replicas(self, spec: DeploymentSpec) -> int:
        """The replicas wanted now: the autoscaler's for a `scaling` spec, else `replicas`."""
        scaled = self._scaled.get(spec.name)
        return spec.desired if scaled is None or spec.scaling is None else scaled[0]

    def autoscale(
        self, spec: DeploymentSpec, seen: list[Instance], slots_per_instance: int, now: float
    ) -> Scaled:
        """The replicas `spec` wants now (`autoscale.decide` over the gateways' fresh reports,
        for a `scaling` spec; else its `desired`), remembered for the next tick."""
        rules = spec.rules(slots_per_instance)
        if rules is None:
            return Scaled(spec.desired)
        versions = {spec.version} | {c.version for c in spec.canary}  # sized together
        live = [
            i for i in seen if i.version in versions and not i.ended and i.draining_since is None
        ]
        wanted, changed = self._scaled.get(spec.name, (max(len(live), rules.min), None))
        fresh = self._fresh(spec.name, now)
        load = None
        serving = sum(i.running for i in live)
        window = self._windows.get(spec.name)
        if window is None or window.span_s != rules.cooldown_s:
            window = self._windows[spec.name] = Window(rules.cooldown_s)
        if fresh:  # every gateway sees the same instances: sum their requests
            load = Load(
                sum(r.load.in_flight for r in fresh),
                sum(r.load.queued for r in fresh),
                max(r.load.oldest_wait_s for r in fresh),
                min(r.load.at for r in fresh),
                min(r.load.idle_s for r in fresh),
            )
            serving = min(serving, *(r.ready for r in fresh))
            window.add(load)
        new = decide(rules, wanted, serving, window, now, changed)
        note = None
        if new != wanted:
            busy = (
                ""
                if load is None
                else f": no request for {load.idle_s:.0f} s"
                if new == 0
                else (
                    f": {load.in_flight} slot(s) held of {serving * rules.slots_per_instance}, "
                    f"{load.queued} queued (oldest {load.oldest_wait_s:.1f} s)"
                )
            )
            note = f"autoscaled from {wanted} to {new} replica(s){busy}"
            changed = now
        self._scaled[spec.name] = (new, changed)
        return Scaled(new, note)
