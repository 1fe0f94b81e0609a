"""Job logs read in blocks: all of it, or its last N lines found by reading back from the end.

Memory stays at one block whatever the log's size: `tail_start` walks back a block at a time
counting newlines and returns an offset, and `read_log` streams forward from it. Lines end with
"\\n" (as `tail -n` counts them; "\\r\\n" ends a line too, a lone "\\r" of a progress bar does not),
and a last line without a newline still counts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

BLOCK = 64 * 1024


def tail_start(f: BinaryIO, lines: int, end: int, block: int = BLOCK) -> int:
    """The offset in `f` (of `end` bytes) where its last `lines` lines begin."""
    if lines <= 0:
        return end
    pos = end
    need = lines  # newlines still to pass, from the end; one ending the file closes a line
    if end > 0:
        f.seek(end - 1)
        need += f.read(1) == b"\n"
    while pos > 0:
        size = min(block, pos)
        pos -= size
        f.seek(pos)
        chunk = f.read(size)
        cut = len(chunk)
        while (cut := chunk.rfind(b"\n", 0, cut)) >= 0:
            need -= 1
            if need == 0:
                return pos + cut + 1
    return 0


def read_log(
    path: str | os.PathLike[str],
    tail: int | None = None,
    block: int = BLOCK,
    since: int = 0,
) -> Iterator[bytes]:
    """The file's bytes as written so far, in blocks of at most `block`: from byte `since` on
    (what a follower has not seen yet), or only its last `tail` lines; nothing when there is no
    such file. The file is opened on the first `next`."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, when the blocks are read or dropped
    except FileNotFoundError:
        return
    with f:
        end = os.fstat(f.fileno()).st_size  # a running job's later output waits for a next read
        pos = min(since, end) if tail is None else tail_start(f, tail, end, block)
        f.seek(pos)
        while pos < end:
            chunk = f.read(min(block, end - pos))
            if not chunk:
                return
            pos += len(chunk)
            yield chunk
