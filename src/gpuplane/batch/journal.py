"""The run journal: one JSON line per finished clip, so a killed run resumes where it stopped.

Only the driver writes it (one writer), appending a whole line and flushing it before the clip
counts as done. On open, a torn last line left by a kill is cut off, and the ids of the finished
clips are read back so the re-run skips them: no result is lost or written twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from gpuplane.batch.pipeline import BatchError


class Journal:
    """Append-only `results.jsonl` in a run directory."""

    def __init__(self, path: Path, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self.done: set[str] = set()
        self.torn_bytes = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            self._recover()
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
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    """clip id → its journal record (for compare)."""
    out: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return out
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.endswith("\n") and line.strip():
                rec = json.loads(line)
                out[rec["clip"]] = rec
    return out
