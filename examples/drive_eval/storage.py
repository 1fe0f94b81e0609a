"""Clip storage that behaves like a remote object store: a local directory behind added latency
and a per-connection bandwidth limit, as an fsspec filesystem (`slowfile:///path/to/clips`).

Options (fsspec storage options, `--storage-option latency_s=0.1`): `latency_s` per request
(default 0.1 s) and `bandwidth_mb_s` per connection (default 5 MB/s). Parallel readers each get
their own connection, as with S3 or GCS.
"""

from __future__ import annotations

import time
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

PROTOCOL = "slowfile"


class SlowFileSystem(LocalFileSystem):  # type: ignore[misc]
    protocol = (PROTOCOL,)

    def __init__(self, latency_s: float = 0.1, bandwidth_mb_s: float = 5.0, **kw: Any) -> None:
        super().__init__(**kw)
        self.latency_s = float(latency_s)
        self.bandwidth = float(bandwidth_mb_s) * 1e6

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        path = str(path)
        if path.startswith(PROTOCOL + "://"):
            path = path[len(PROTOCOL) + 3 :]
        return LocalFileSystem._strip_protocol(path)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> bytes:
        data: bytes = super().cat_file(path, start=start, end=end, **kw)
        time.sleep(self.latency_s + len(data) / self.bandwidth)
        return data

    def ls(self, path: str, detail: bool = False, **kw: Any) -> Any:
        time.sleep(self.latency_s)
        return super().ls(path, detail=detail, **kw)


def register() -> None:
    fsspec.register_implementation(PROTOCOL, SlowFileSystem, clobber=True)
