"""The file lease store: gateways on one machine elect a leader through one file.

Each operation holds an exclusive `fcntl` lock on `PATH.lock` while it reads the record
(`PATH`, JSON), decides with the pure `lease.take`, and replaces the record atomically (a temp
file renamed over it, so a reader never sees half of one). Times are `CLOCK_MONOTONIC`, which
on Linux is one clock for every process of a boot; the record carries the boot id, so a
lease written before a reboot counts as run out.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from gpuplane.serve.ha.lease import LeaderLease, LeaseRecord, answer, check_epoch, released, take
from gpuplane.serve.ha.settings import HaConfig
from gpuplane.serve.ha.store import Journal, LeaseStore, register

T = TypeVar("T")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""  # not Linux: a record from another boot cannot be told apart


@register
class FileStore(LeaseStore):
    name = "file"
    errors = (OSError, ValueError)

    def __init__(self, cfg: HaConfig, timeout_s: float) -> None:
        super().__init__(cfg, timeout_s)
        assert cfg.path is not None  # the settings require it for lease: file
        self.path = Path(cfg.path)
        self.clock: Callable[[], float] = time.monotonic
        self.boot = boot_id()

    async def _claim(self, holder: str, url: str | None, ttl_s: float) -> LeaderLease:
        def claim(doc: dict[str, Any]) -> LeaderLease:
            now = self.clock()
            record = take(self._record(doc), holder, url, now, ttl_s)
            self._put(doc, record)
            return answer(record, now)

        return await self._locked(claim)

    async def _release(self, holder: str, epoch: int) -> None:
        def release(doc: dict[str, Any]) -> None:
            record = released(self._record(doc), holder, epoch, self.clock())
            if record is not None:
                self._put(doc, record)

        await self._locked(release)

    async def _write_journal(self, epoch: int, data: bytes) -> None:
        def write(doc: dict[str, Any]) -> None:
            check_epoch(int(doc.get("epoch", 0)), epoch)
            doc["journal"] = {"epoch": epoch, "data": data.decode()}

        await self._locked(write)

    async def _read_journal(self) -> Journal | None:
        def read(doc: dict[str, Any]) -> Journal | None:
            j = doc.get("journal")
            return None if j is None else Journal(int(j["epoch"]), str(j["data"]).encode())

        return await self._locked(read)

    def _record(self, doc: dict[str, Any]) -> LeaseRecord | None:
        if "holder" not in doc:
            return None
        expires = float(doc["expires_at"]) if doc.get("boot") == self.boot else -1.0
        return LeaseRecord(str(doc["holder"]), int(doc["epoch"]), expires, doc.get("url"))

    def _put(self, doc: dict[str, Any], record: LeaseRecord) -> None:
        doc.update(
            holder=record.holder,
            epoch=record.epoch,
            expires_at=record.expires_at,
            url=record.url,
            boot=self.boot,
        )

    async def _locked(self, op: Callable[[dict[str, Any]], T]) -> T:
        """Run `op` on the record under the lock, in a thread (the lock may be waited for);
        the record is written back when `op` changed it."""
        return await asyncio.to_thread(self._locked_sync, op)

    def _locked_sync(self, op: Callable[[dict[str, Any]], T]) -> T:
        with self._lock():
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                text = "{}"
            doc: dict[str, Any] = json.loads(text)
            before = dict(doc)
            result = op(doc)
            if doc != before:
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(doc))
                os.replace(tmp, self.path)
            return result

    @contextmanager
    def _lock(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock
