"""Job logs read from the end in blocks: the lines `tail` promises, in memory bounded by a block."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuplane.control.adapters.local import LocalAdapter
from gpuplane.control.logtail import read_log
from gpuplane.control.service.service import ControlService
from tests.control.svc_helpers import api_client, job, wait_state

MIB = 1024 * 1024


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "job.log"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("block", [1, 3, 64 * 1024])
@pytest.mark.parametrize(
    ("data", "tail", "expected"),
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 1, b"c\n"),
        (b"a\nb\nc", 1, b"c"),  # a last line without a newline counts
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\r\nb\r\nc\r\n", 2, b"b\r\nc\r\n"),  # CRLF lines keep their \r
        (b"a\n\n\nb\n", 3, b"\n\nb\n"),  # empty lines are lines
        (b"a\nb\n", 10, b"a\nb\n"),  # more lines asked than the file has: all of it
        (b"a\nb\n", 0, b""),
        (b"", 3, b""),
        (b"\n", 1, b"\n"),
        (b"x" * 200 + b"\n" + b"y" * 300 + b"\n", 1, b"y" * 300 + b"\n"),  # longer than a block
        (b"x" * 500, 1, b"x" * 500),  # one line, no newline at all
    ],
)
def test_tail_returns_the_last_lines(
    tmp_path: Path, data: bytes, tail: int, expected: bytes, block: int
) -> None:
    chunks = list(read_log(write(tmp_path, data), tail, block=block))
    assert b"".join(chunks) == expected
    assert all(0 < len(c) <= block for c in chunks)


def test_a_whole_log_comes_in_blocks_and_a_missing_one_is_empty(tmp_path: Path) -> None:
    data = b"".join(b"line %d\n" % k for k in range(1000))
    chunks = list(read_log(write(tmp_path, data), block=1000))
    assert b"".join(chunks) == data
    assert max(len(c) for c in chunks) == 1000
    assert list(read_log(tmp_path / "none.log")) == []
    assert list(read_log(tmp_path / "none.log", tail=5)) == []


def big_log(tmp_path: Path, size: int = 50 * MIB) -> Path:
    """A log of about `size` bytes, lines of 100 bytes, ending in "last line\\n"."""
    path = tmp_path / "big.log"
    line = b"x" * 99 + b"\n"
    with open(path, "wb") as f:
        block = line * (MIB // len(line))
        for _ in range(size // len(block)):
            f.write(block)
        f.write(b"last line\n")
    return path


def peak_bytes(run: Iterator[bytes], keep: bool) -> tuple[int, bytes]:
    """Peak traced memory while `run` is consumed, and what it yielded (if `keep`)."""
    tracemalloc.start()
    try:
        kept = [c for c in run if keep]
        return tracemalloc.get_traced_memory()[1], b"".join(kept)
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("since", "expected"), [(0, b"a\nb\nc\n"), (2, b"b\nc\n"), (5, b"\n"), (6, b""), (99, b"")]
)
def test_since_reads_only_what_lies_past_that_byte(
    tmp_path: Path, since: int, expected: bytes
) -> None:
    path = write(tmp_path, b"a\nb\nc\n")
    assert b"".join(read_log(path, since=since, block=2)) == expected


def test_the_api_gives_a_follower_only_the_bytes_it_has_not_seen(
    service: ControlService, client: TestClient
) -> None:
    out = client.post("/jobs", json=job("two", command=["sh", "-c", "echo one; echo two"])).json()
    wait_state(service, out["id"], "succeeded")
    logs = f"/jobs/{out['id']}/logs"
    assert client.get(logs).text == "one\ntwo\n"
    assert client.get(logs, params={"since": 4}).text == "two\n"
    assert client.get(logs, params={"since": 8}).text == ""
    both = client.get(logs, params={"since": 4, "tail": 1})
    assert both.status_code == 422
    assert "tail or since" in both.text
    assert client.get(logs, params={"since": -1}).status_code == 422


def test_tailing_or_streaming_a_50_mib_log_holds_about_one_block(tmp_path: Path) -> None:
    path = big_log(tmp_path)
    peak, text = peak_bytes(read_log(path, tail=3), keep=True)
    assert text == b"x" * 99 + b"\n" + b"x" * 99 + b"\n" + b"last line\n"
    assert peak < 2 * MIB, f"tail held {peak / MIB:.1f} MiB of a 50 MiB log"
    peak, _ = peak_bytes(read_log(path), keep=False)
    assert peak < 2 * MIB, f"streaming held {peak / MIB:.1f} MiB of a 50 MiB log"


def test_the_api_tails_a_large_log_without_reading_it_whole(service: ControlService) -> None:
    with api_client(service) as client:
        out = client.post("/jobs", json=job("quiet", command=["true"])).json()
        wait_state(service, out["id"], "succeeded")
        adapter = service.adapters["local"]
        assert isinstance(adapter, LocalAdapter)
        path = Path(adapter.log_path(out["id"]))
        big_log(path.parent).replace(path)
        tracemalloc.start()
        try:
            r = client.get(f"/jobs/{out['id']}/logs", params={"tail": 2})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert r.status_code == 200
        assert r.text == "x" * 99 + "\nlast line\n"
        assert peak < 4 * MIB, f"the API held {peak / MIB:.1f} MiB to tail a 50 MiB log"
        whole = client.get(f"/jobs/{out['id']}/logs")
        assert len(whole.content) == path.stat().st_size
        assert client.get("/jobs/nope/logs").status_code == 404
