"""The run journal: one JSON line per finished clip, so a killed run resumes where it stopped.

Only the driver writes it (one writer), appending a whole line and flushing it before the clip
counts as done. On open, a torn last line left by a kill is cut off, and the ids of the finished
clips are read back so the re-run skips them: no result is lost or written twice. A line is the
clip's record for good (which invocation finished it, after how many attempts, its hits, stage
times and reduced output): run.json's figures are folded from these lines (`summary`).
"""

from __future__ import annotations

import bisect
import fcntl
import hashlib
import heapq
import json
import os
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from gpuplane.batch.clips import ClipRef
from gpuplane.batch.errors import BatchError


class IdSet:
    """Clip ids as 64-bit digests: 8 bytes each in a sorted array plus a small recent set.

    A 100,000-clip run keeps under 1 MiB here instead of ~10 MiB of strings, so the driver's
    memory stays flat. Two ids collide with probability ~n²/2⁶⁵ (3e-10 at 100,000 clips).
    """

    __slots__ = ("_old", "_recent")
    MERGE_AT = 4096

    def __init__(self) -> None:
        self._old = array("Q")
        self._recent: set[int] = set()

    @staticmethod
    def digest(clip: str) -> int:
        return int.from_bytes(hashlib.blake2b(clip.encode(), digest_size=8).digest(), "big")

    def add(self, clip: str) -> None:
        self._recent.add(self.digest(clip))
        if len(self._recent) >= self.MERGE_AT:
            # streamed merge: no transient list of Python ints as large as the whole set
            self._old = array("Q", heapq.merge(self._old, sorted(self._recent)))
            self._recent.clear()

    def __contains__(self, clip: object) -> bool:
        if not isinstance(clip, str):
            return False
        h = self.digest(clip)
        if h in self._recent:
            return True
        i = bisect.bisect_left(self._old, h)
        return i < len(self._old) and self._old[i] == h

    def __len__(self) -> int:
        return len(self._old) + len(self._recent)


class ResultsJournal:
    """Append-only `results.jsonl` in a run directory."""

    def __init__(self, path: Path, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self.done = IdSet()
        self.skipped = 0  # clips `todo` left out, finished already
        self.torn_bytes = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        # one writer per run directory, also across processes: a second run of the same command
        # while the first still runs would otherwise write some clips twice
        self._lock: IO[bytes] | None = path.with_name(path.name + ".lock").open("ab")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise BatchError(
                f"another run is writing {path.parent}; wait for it to finish (or stop it), "
                "or pass a different --out"
            ) from None
        try:
            if path.exists():
                self._recover()
        except BaseException:
            self.close()
            raise
        self._fh: IO[str] | None = path.open("a", encoding="utf-8")

    def _recover(self) -> None:
        data = self.path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut < len(data):  # a kill in the middle of a line: that clip was not done
            self.torn_bytes = len(data) - cut
            with self.path.open("r+b") as fh:
                fh.truncate(cut)
        for n, line in enumerate(data[:cut].splitlines(), 1):
            if not line.strip():
                continue
            try:
                self.done.add(json.loads(line)["clip"])
            except (ValueError, KeyError) as exc:
                raise BatchError(
                    f"{self.path}:{n} is not a journal line ({exc}); "
                    "move the file away to start the run afresh"
                ) from exc

    def todo(self, clips: Iterable[ClipRef]) -> Iterator[ClipRef]:
        """The clips not finished yet, streamed; those finished are counted in `skipped`."""
        for ref in clips:
            if ref.id in self.done:
                self.skipped += 1
            else:
                yield ref

    def append(self, clip: str, record: dict[str, Any]) -> None:
        if clip in self.done:
            raise BatchError(f"clip {clip!r} is already in the journal (a bug: it ran twice)")
        if self._fh is None:
            raise BatchError("journal is closed")
        self._fh.write(json.dumps({"clip": clip, **record}, separators=(",", ":")) + "\n")
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())
        self.done.add(clip)

    def close(self) -> None:
        fh, self._fh = getattr(self, "_fh", None), None
        if fh is not None:
            fh.close()
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.close()  # releases the flock


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every whole record in the journal (all invocations that wrote it), streaming."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.endswith("\n") and line.strip():
                yield json.loads(line)


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    """clip id → its journal record (for compare)."""
    return {rec["clip"]: rec for rec in iter_records(path)}
