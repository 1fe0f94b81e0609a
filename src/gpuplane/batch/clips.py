"""Clips: listing them under a dataset root, their cache identity, and reading their bytes.

A clip's cache identity is its path relative to the dataset root plus the version of its
content (the store's checksum, else size and mtime; a digest of its bytes with `verified`, what
`--verify-clips` asks for): two clips never share a stage result, and a copy of the dataset
elsewhere still hits. Listing needs only the store's metadata, so every cache key is known before
any clip byte is read.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import posixpath
from collections.abc import Iterator, Mapping
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


class ClipReader:
    """Reads clips' bytes with the clips' storage options, one filesystem per URL protocol.

    fsspec keeps a filesystem instance per thread: `fs_for` is called on the driver's thread and
    its filesystem handed to the I/O pool's threads with each fetch, so they share one.
    """

    def __init__(self, storage_options: Mapping[str, Any]) -> None:
        self.storage_options = dict(storage_options)
        self._fs: dict[str, Any] = {}

    def fs_for(self, url: str) -> Any:
        proto = url.split("://", 1)[0] if "://" in url else "file"
        if proto not in self._fs:
            self._fs[proto] = fsspec.core.url_to_fs(url, **self.storage_options)[0]
        return self._fs[proto]

    def read(self, ref: ClipRef, fs: Any = None) -> bytes:
        """The clip's bytes, through `fs` (default: this thread's `fs_for` the clip's URL)."""
        if fs is None:
            fs = self.fs_for(ref.url)
        return bytes(fs.cat_file(fs._strip_protocol(ref.url)))
