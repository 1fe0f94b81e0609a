"""Instance health for one model: a request's failures (passive), probes, and what the engines'
supervisor reports.

Pure: it counts each instance's failures in a row, marks instances healthy or not in the slot
table, and tells its owner (the router) of every change with the reason; no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuplane.serve.errors import FailureKind
from gpuplane.serve.slots import SlotTable


class InstanceHealth:
    """`changed(instance_id, healthy, why)` is called after each change of an instance's health
    (not when a report confirms it)."""

    def __init__(
        self,
        slots: SlotTable,
        failure_threshold: int,
        changed: Callable[[str, bool, str], None],
    ) -> None:
        self.slots = slots
        self.failure_threshold = failure_threshold
        self._changed = changed
        self._failures = {i.id: 0 for i in slots.instances}  # consecutive, per instance

    def add(self, instance_id: str) -> None:
        """A new instance in the slot table (unhealthy until its first success)."""
        self._failures[instance_id] = 0

    def remove(self, instance_id: str) -> None:
        self._failures.pop(instance_id, None)

    def report_success(self, instance_id: str) -> None:
        """It answered a probe or a request (an instance no longer in the table: ignored)."""
        if instance_id not in self.slots:
            return
        self._failures[instance_id] = 0
        self._set(instance_id, True, "it answered a health probe or a request")

    def report_failure(self, instance_id: str, kind: FailureKind, detail: str = "") -> None:
        """Passive health: a refused connection marks the instance down at once; other failures
        count until `failure_threshold` in a row. `detail` says what failed, for the log."""
        if instance_id not in self.slots:
            return  # removed meanwhile (a probe or request that ended after its drain)
        n = self._failures[instance_id] = self._failures[instance_id] + 1
        if kind is FailureKind.CONNECT or n >= self.failure_threshold:
            why = f"{n} failure(s) in a row, the last ({kind.value}): {detail}"
            if self.slots.get(instance_id).healthy:
                self.slots.get(instance_id).last_error = why  # what /admin/state shows
            self._set(instance_id, False, why)

    def report_engine(
        self, instance_id: str, *, up: bool, error: str | None, crash_looping: bool
    ) -> None:
        """What the instance's supervisor saw: its process answers again (`up`), or exited and
        waits to restart; `error` is the diagnosis of its last exit."""
        inst = self.slots.get(instance_id)
        inst.last_error = error
        inst.crash_looping = crash_looping
        if up:
            self.report_success(instance_id)
        else:
            self._set(instance_id, False, f"its engine exited ({error or 'no diagnosis'})")

    def unhealthy_message(self, model: str) -> str:
        """Why no instance of `model` can take a request: the supervisors' diagnoses where they
        have one."""
        insts = self.slots.instances
        if not insts:
            return (
                f"model '{model}' has no instance now (its deployment is starting, scaled to "
                "zero or deleted); retry later, or see `gpuplane deploy describe`"
            )
        if all(i.crash_looping for i in insts):
            return f"model '{model}' cannot be served: " + "; ".join(
                str(i.last_error) for i in insts
            )
        known = "; ".join(str(i.last_error) for i in insts if i.last_error)
        return (
            f"all {len(insts)} instances of model '{model}' are unhealthy; retry later or "
            "check the engines" + (f". Their last errors: {known}" if known else "")
        )

    def _set(self, instance_id: str, healthy: bool, why: str) -> None:
        if self.slots.set_healthy(instance_id, healthy):
            self._changed(instance_id, healthy, why)
