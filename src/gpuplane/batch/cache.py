"""The stage cache: version-keyed entries on any fsspec URL, atomic writes, digest-checked reads.

An entry lives at `<root>/<stage>/<version>/<key[:2]>/<key>.gpc` (the version URL-quoted; under
it so `cache ls|du` show it and `cache gc --superseded` can drop versions no run uses) and is
`MAGIC + sha256(payload) + payload` (payload = pickle). A write goes to a unique temp name and
is renamed into place, so a reader sees a whole entry or none, and concurrent writers of the
same key (which write the same bytes) cannot corrupt each other: the last rename wins. A read
whose digest does not match is deleted and reported as a miss, so a corrupt entry is
recomputed, never used. The cache is trusted storage (pickle): point it only at a location your
team controls.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import threading
import uuid
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import fsspec

from gpuplane.batch.errors import BatchError

MAGIC = b"GPC1"
_HEADER = len(MAGIC) + 32
SUFFIX = ".gpc"
PROFILE = ".profiles.json"


@dataclass(slots=True)
class StageStats:
    """Hit/miss counters of one stage; merged across workers by the runner."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    writes: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def merge(self, other: StageStats) -> None:
        self.hits += other.hits
        self.misses += other.misses
        self.corrupt += other.corrupt
        self.writes += other.writes
        self.bytes_read += other.bytes_read
        self.bytes_written += other.bytes_written


@dataclass(frozen=True, slots=True)
class Entry:
    stage: str
    key: str
    path: str
    size: int
    mtime: float
    version: str | None = None  # None: a temp file, or an entry of the layout without versions


@dataclass(slots=True)
class CacheStats:
    by_stage: dict[str, StageStats] = field(default_factory=dict)

    def of(self, stage: str) -> StageStats:
        return self.by_stage.setdefault(stage, StageStats())


def stage_dir(root: str, stage: str, version: str) -> str:
    """Where a stage version's entries lie under a cache root or URL (the run report links it)."""
    return f"{root.rstrip('/')}/{stage}/{quote(version, safe='')}/"


def encode(value: Any) -> bytes:
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return MAGIC + hashlib.sha256(payload).digest() + payload


def decode(blob: bytes) -> Any:
    """The value in an entry; raises ValueError when the bytes are not a whole, valid entry."""
    if len(blob) < _HEADER or not blob.startswith(MAGIC):
        raise ValueError("not a gpuplane cache entry")
    payload = blob[_HEADER:]
    if hashlib.sha256(payload).digest() != blob[len(MAGIC) : _HEADER]:
        raise ValueError("digest mismatch")
    return pickle.loads(payload)


class StageCache:
    """Entries under one fsspec root URL; thread-safe; cheap to pickle (holds only the URL)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.stats = CacheStats()
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return (StageCache, (self.url, self.storage_options))

    def path(self, stage: str, version: str, key: str) -> str:
        return f"{stage_dir(self.root, stage, version)}{key[:2]}/{key}{SUFFIX}"

    def get(self, stage: str, version: str, key: str) -> tuple[bool, Any]:
        """(True, value) on a verified hit; (False, None) on a miss or a corrupt entry."""
        path = self.path(stage, version, key)
        try:
            blob = self.fs.cat_file(path)
        except FileNotFoundError:
            self._count(stage, misses=1)
            return False, None
        try:
            value = decode(blob)
        except Exception:  # any undecodable entry is garbage: drop it and recompute
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)
            self._count(stage, misses=1, corrupt=1)
            return False, None
        self._count(stage, hits=1, bytes_read=len(blob))
        return True, value

    def contains(self, stage: str, version: str, key: str) -> bool:
        return bool(self.fs.exists(self.path(stage, version, key)))

    def put(self, stage: str, version: str, key: str, value: Any) -> int:
        """Write atomically (temp + rename); returns the bytes written."""
        blob = encode(value)
        path = self.path(stage, version, key)
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        try:
            self.fs.pipe_file(tmp, blob)
            self.fs.mv(tmp, path)
        except BaseException:
            with contextlib.suppress(Exception):
                self.fs.rm_file(tmp)
            raise
        self._count(stage, writes=1, bytes_written=len(blob))
        return len(blob)

    def load_profile(self) -> dict[str, float]:
        """Seconds per clip per stage measured by earlier runs (a planning hint, maybe stale)."""
        try:
            doc = json.loads(self.fs.cat_file(f"{self.root}/{PROFILE}"))
        except (FileNotFoundError, ValueError):
            return {}
        return {str(k): float(v) for k, v in doc.items()} if isinstance(doc, dict) else {}

    def save_profile(self, profile: dict[str, float]) -> None:
        merged = self.load_profile() | profile
        path = f"{self.root}/{PROFILE}"
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        self.fs.makedirs(self.root, exist_ok=True)
        self.fs.pipe_file(tmp, json.dumps(merged, sort_keys=True).encode())
        self.fs.mv(tmp, path)

    def _count(self, stage: str, **deltas: int) -> None:
        with self._lock:
            s = self.stats.of(stage)
            for name, d in deltas.items():
                setattr(s, name, getattr(s, name) + d)

    def entries(self) -> Iterator[Entry]:
        """Every entry (temp files from crashed writers included as stage `<tmp>`)."""
        if not self.fs.exists(self.root):
            return
        for dirpath, _dirs, files in self.fs.walk(self.root, detail=True):
            for name, info in files.items():
                if name.startswith(PROFILE):
                    continue
                parts = f"{dirpath}/{name}"[len(self.root) + 1 :].split("/")
                is_entry = name.endswith(SUFFIX)
                key = name[: -len(SUFFIX)] if is_entry else name
                yield Entry(
                    parts[0] if is_entry else "<tmp>",
                    key,
                    f"{dirpath}/{name}",
                    int(info.get("size") or 0),
                    info_mtime(info),
                    unquote(parts[1]) if is_entry and len(parts) == 4 else None,
                )

    def remove(self, entry: Entry) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(entry.path)


def info_mtime(info: Mapping[str, Any]) -> float:
    """Seconds since the epoch of an fsspec `info()`, whichever name the store gives it."""
    for name in ("mtime", "LastModified", "updated", "created"):
        value = info.get(name)
        if isinstance(value, int | float):
            return float(value)
        if value is not None and hasattr(value, "timestamp"):
            return float(value.timestamp())
    return 0.0


@dataclass(frozen=True, slots=True)
class GcPlan:
    """Which entries a gc removes and why; computed without touching storage."""

    remove: tuple[Entry, ...]
    keep_bytes: int
    freed_bytes: int


def is_superseded(entry: Entry, used: Mapping[str, Set[str]]) -> bool:
    """An entry of a stage some run used, of a version none of them used (or of no version: the
    layout before versions, which nothing reads). Stages no run names are never superseded."""
    versions = used.get(entry.stage, set())
    return bool(versions) and entry.version not in versions


def plan_gc(
    entries: list[Entry],
    now: float,
    max_age_s: float | None = None,
    max_bytes: int | None = None,
    tmp_grace_s: float = 3600.0,
    used: Mapping[str, Set[str]] | None = None,
) -> GcPlan:
    """Evict entries of superseded versions (`used`: the versions runs used per stage, see
    `is_superseded`) and entries older than `max_age_s`, then the oldest until the rest fit in
    `max_bytes`.

    Temp files of crashed writers older than `tmp_grace_s` go too; younger ones may belong to a
    writer still running.
    """
    if max_age_s is not None and max_age_s < 0:
        raise BatchError(f"max age must be >= 0 seconds, got {max_age_s}")
    if max_bytes is not None and max_bytes < 0:
        raise BatchError(f"max size must be >= 0 bytes, got {max_bytes}")
    drop: list[Entry] = []
    keep: list[Entry] = []
    for e in entries:
        if e.stage == "<tmp>":
            (drop if now - e.mtime > tmp_grace_s else keep).append(e)
        elif (used is not None and is_superseded(e, used)) or (
            max_age_s is not None and now - e.mtime > max_age_s
        ):
            drop.append(e)
        else:
            keep.append(e)
    total = sum(e.size for e in keep)
    if max_bytes is not None and total > max_bytes:
        for e in sorted(keep, key=lambda e: (e.mtime, e.path)):
            if total <= max_bytes:
                break
            if e.stage == "<tmp>":
                continue
            drop.append(e)
            total -= e.size
    drop_paths = {e.path for e in drop}
    kept = sum(e.size for e in entries if e.path not in drop_paths)
    return GcPlan(tuple(drop), kept, sum(e.size for e in drop))


def human_size(n: int) -> str:
    """Bytes as people read them: 512 B, 1.5 KiB, 20.0 MiB, 3.2 GiB (units `parse_size` reads)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def parse_size(text: str) -> int:
    """'500M', '2G', '1024' → bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(float(t))
    except ValueError:
        raise BatchError(f"size {text!r}: use a number of bytes or 500M, 2G, 1T") from None


def parse_age(text: str) -> float:
    """'30s', '15m', '12h', '7d' → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            return float(t[:-1]) * units[t[-1]]
        return float(t)
    except ValueError:
        raise BatchError(f"age {text!r}: use seconds or 30m, 12h, 7d") from None
