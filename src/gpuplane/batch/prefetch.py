"""Clip sources and the prefetcher: I/O ahead of compute on its own pool, bounded by items, bytes.

`Budget` is the pure back-pressure core (ask with `can_admit`, commit with `admit`, `release`
when the consumer is done with the data). `Prefetcher` runs `load(item)` jobs on a thread pool
and never holds more than `max_items` loaded-but-unconsumed items or `max_bytes` of them; a
single item larger than `max_bytes` is admitted only when nothing else is held, so it cannot
deadlock.

A clip's cache identity is its path relative to the dataset root plus the version of its
content (the store's checksum, else size and mtime; a digest of its bytes with `verified`): two
clips never share a stage result, and a copy of the dataset elsewhere still hits.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import posixpath
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec

from gpuplane.batch.cache import info_mtime
from gpuplane.batch.errors import BatchError

CONTENT_CHECKSUMS = ("md5Hash", "Content-MD5", "md5", "crc32c", "ETag", "etag")
"""`info()` keys that name a clip's content, the first present honoured: gcsfs gives `md5Hash`
(absent for composite objects) and `crc32c`, HTTP servers `Content-MD5` and `ETag`, s3fs `ETag`,
adlfs `etag`. fsspec's local and memory filesystems give none: size and mtime stand in."""


@dataclass(frozen=True, slots=True)
class ClipRef:
    """One clip: a stable id, the URL of its bytes, its size, its path relative to the dataset
    root (its identity, wherever the root is) and the version of its content (`content_version`,
    or `sha256=…` once `verified`)."""

    id: str
    url: str
    size: int
    path: str
    version: str

    @property
    def fingerprint(self) -> str:
        """What the cache keys of this clip are built from: which clip, which content."""
        doc = json.dumps([self.path, self.version])
        return hashlib.sha256(doc.encode()).hexdigest()[:32]


def content_version(info: Mapping[str, Any]) -> str:
    """The store's checksum of the content when `info` has one, else its size and mtime."""
    size = int(info.get("size") or 0)
    for key in CONTENT_CHECKSUMS:
        if info.get(key):
            return f"size={size} {key}={info[key]}"
    return f"size={size} mtime={info_mtime(info)!r}"


def verified(ref: ClipRef, data: bytes) -> ClipRef:
    """`ref` versioned by a digest of its bytes (`--verify-clips`): edits that keep the size and
    the mtime (or a store's stale checksum) cannot make it hit another content's entries."""
    return dataclasses.replace(ref, version=f"sha256={hashlib.sha256(data).hexdigest()}")


def list_clips(
    url: str,
    pattern: str = "*",
    storage_options: dict[str, Any] | None = None,
) -> Iterator[ClipRef]:
    """The clips under an fsspec URL, in name order, one directory listing at a time.

    Identity and version come from the listing's metadata (`content_version`), so cache keys
    are known before any clip byte is read.
    """
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    if not fs.exists(root):
        raise BatchError(f"clip location {url!r} does not exist; generate clips or fix --clips")
    if fs.isfile(root):
        yield _ref(root, posixpath.basename(root), fs.info(root), url)
        return
    protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
    for dirpath, _dirs, files in fs.walk(root, detail=True):
        for name in sorted(files):
            if fnmatch.fnmatch(name, pattern) and files[name].get("type") != "directory":
                path = f"{dirpath}/{name}"
                rel = posixpath.relpath(path, root)
                yield _ref(path, rel, files[name], f"{protocol}{path}")


def _ref(path: str, rel: str, info: Mapping[str, Any], url: str) -> ClipRef:
    ident = path.rsplit("/", 1)[-1]
    for ext in (".npz", ".bin", ".clip"):
        ident = ident.removesuffix(ext)
    return ClipRef(ident, url, int(info.get("size") or 0), rel, content_version(info))


class Budget:
    """Pure accounting of items and bytes held; not thread-safe (the Prefetcher locks it)."""

    __slots__ = ("bytes", "items", "max_bytes", "max_items")

    def __init__(self, max_items: int, max_bytes: int) -> None:
        if max_items < 1:
            raise BatchError(f"prefetch must allow at least 1 item, got {max_items}")
        if max_bytes < 1:
            raise BatchError(f"prefetch must allow at least 1 byte, got {max_bytes}")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.items = 0
        self.bytes = 0

    def can_admit(self, size: int) -> bool:
        if self.items == 0:
            return True  # an oversized item alone still gets through
        return self.items + 1 <= self.max_items and self.bytes + size <= self.max_bytes

    def admit(self, size: int) -> None:
        self.items += 1
        self.bytes += size

    def release(self, size: int) -> None:
        self.items -= 1
        self.bytes -= size
        if self.items < 0 or self.bytes < 0:
            raise BatchError("prefetch budget released more than it admitted (a bug)")


class Prefetcher:
    """Runs loads ahead of the consumer on `workers` threads, within a `Budget`.

    `submit(size, load)` blocks while the budget is full (back-pressure on the producer) and
    returns a Future; the consumer calls `release(size)` once it no longer needs the data.
    """

    def __init__(self, workers: int, max_items: int, max_bytes: int) -> None:
        self.budget = Budget(max_items, max_bytes)
        self._cond = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="fetch")
        self.peak_items = 0
        self.peak_bytes = 0

    def try_submit(self, size: int, load: Callable[[], Any]) -> Future[Any] | None:
        """Admit and start `load` if the budget allows now; None otherwise (ask, then commit)."""
        with self._cond:
            if not self.budget.can_admit(size):
                return None
            self.budget.admit(size)
            self.peak_items = max(self.peak_items, self.budget.items)
            self.peak_bytes = max(self.peak_bytes, self.budget.bytes)
        return self._pool.submit(load)

    def submit(
        self,
        size: int,
        load: Callable[[], Any],
        timeout: float | None = None,
    ) -> Future[Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: self.budget.can_admit(size), timeout):
                raise TimeoutError("prefetch budget stayed full")
        fut = self.try_submit(size, load)
        if fut is None:  # lost a race with another producer; wait again
            return self.submit(size, load, timeout)
        return fut

    def release(self, size: int) -> None:
        with self._cond:
            self.budget.release(size)
            self._cond.notify_all()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
