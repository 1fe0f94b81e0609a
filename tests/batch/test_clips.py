"""Clips: listing, and their cache keys: which clip (its path in the dataset) and which content,
never size + mtime."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pytest
from typer.testing import CliRunner

from gpuplane.batch.clips import content_version, list_clips
from gpuplane.batch.errors import BatchError
from gpuplane.cli.batch import app
from tests.helpers.batch import TOY, RunFn, expected, outputs

MTIME_NS = 1_700_000_000 * 10**9  # tar keeps whole seconds: clips written in one second share it


def same_size_clips(root: Path, n: int) -> Path:
    """`n` clips of one size and one mtime, different content: what a tar copy of the reference
    dataset (fixed-shape uncompressed .npz files) looks like."""
    root.mkdir(parents=True)
    for i in range(n):
        path = root / f"clip-{i:04d}.bin"
        path.write_bytes(bytes((i * 7 + j) % 251 for j in range(600)))
        os.utime(path, ns=(MTIME_NS, MTIME_NS))
    return root


def test_clips_of_equal_size_and_mtime_never_share_a_result(run_toy: RunFn, tmp_path: Path) -> None:
    source = same_size_clips(tmp_path / "src", 12)
    with tarfile.open(tmp_path / "clips.tar", "w") as tar:
        tar.add(source, arcname="clips")
    with tarfile.open(tmp_path / "clips.tar") as tar:
        tar.extractall(tmp_path / "copy", filter="data")
    clips = tmp_path / "copy" / "clips"
    assert len({p.stat().st_mtime_ns for p in clips.iterdir()}) == 1
    res = run_toy("a", clip_dir=clips)  # a fresh cache
    assert outputs(tmp_path / "a") == expected(clips)
    assert res["stages"]["perception"]["computed"] == 12


def test_a_copied_dataset_is_served_from_the_cache(
    run_toy: RunFn, clips: Path, tmp_path: Path
) -> None:
    run_toy("a")
    copy = shutil.copytree(clips, tmp_path / "elsewhere" / "clips")  # names, bytes, mtimes kept
    res = run_toy("b", clip_dir=copy)
    assert {n: s["cached"] for n, s in res["stages"].items()} == dict.fromkeys(res["stages"], 12)
    assert outputs(tmp_path / "b") == expected(clips)


def test_a_changed_clip_is_recomputed(run_toy: RunFn, clips: Path, tmp_path: Path) -> None:
    run_toy("a")
    victim = clips / "clip-0003.bin"
    victim.write_bytes(bytes(reversed(victim.read_bytes())))  # same size, new mtime
    res = run_toy("b")
    p = res["stages"]["perception"]
    assert (p["computed"], p["cached"]) == (1, 11)
    assert outputs(tmp_path / "b") == expected(clips)


def test_verify_clips_recomputes_a_clip_changed_behind_a_forged_size_and_mtime(
    tmp_path: Path,
) -> None:
    clips = same_size_clips(tmp_path / "clips", 4)
    cli = CliRunner()

    def run(out: str) -> dict[str, dict[str, int]]:
        args = ["run", TOY, "--clips", str(clips), "--out", str(tmp_path / out), "--cache",
                str(tmp_path / "cache"), "--threads", "--no-report", "--verify-clips", "-o",
                "json"]  # fmt: skip
        res = cli.invoke(app, args)
        assert res.exit_code == 0, res.output
        stages: dict[str, dict[str, int]] = json.loads(res.output)["stages"]
        return stages

    assert run("a")["perception"]["computed"] == 4
    before = {r.id: r.fingerprint for r in list_clips(str(clips))}
    victim = clips / "clip-0002.bin"
    victim.write_bytes(bytes(reversed(victim.read_bytes())))
    os.utime(victim, ns=(MTIME_NS, MTIME_NS))
    # the forgery fools the store's metadata: only the bytes tell the clips apart
    assert {r.id: r.fingerprint for r in list_clips(str(clips))} == before
    second = run("b")["perception"]
    assert (second["computed"], second["cached"]) == (1, 3)
    assert outputs(tmp_path / "b") == expected(clips)


def test_a_store_checksum_is_the_version_so_a_copy_with_new_times_still_hits() -> None:
    s3 = {"size": 10, "ETag": '"9a0364b9e99bb480dd25e1f0284c8555"', "type": "file"}
    early = s3 | {"LastModified": datetime(2025, 1, 1, tzinfo=UTC)}
    late = s3 | {"LastModified": datetime(2026, 1, 1, tzinfo=UTC)}
    assert content_version(early) == content_version(late)
    assert content_version(early) != content_version(early | {"ETag": '"other"'})
    gcs = {"size": 10, "md5Hash": "mgNkuembtIDdJeHwKEyFVQ==", "crc32c": "yZRlqg==", "mtime": 1.0}
    assert content_version(gcs) == content_version(gcs | {"mtime": 2.0, "etag": "CJ2"})
    assert content_version(gcs) != content_version(gcs | {"md5Hash": "other"})
    composite = gcs | {"md5Hash": None}  # gcs gives no md5 for a composite object
    assert content_version(composite) != content_version(composite | {"crc32c": "other"})
    local = {"size": 10, "mtime": 1.5, "type": "file"}  # no checksum: size and mtime
    assert content_version(local) != content_version(local | {"mtime": 2.5})
    assert content_version(local) != content_version(local | {"size": 11})


def test_list_clips_local_and_memory(tmp_path: Path) -> None:
    for name in ("b.bin", "a.bin", "skip.txt"):
        (tmp_path / name).write_bytes(name.encode())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.bin").write_bytes(b"ccc")
    refs = list(list_clips(str(tmp_path), "*.bin"))
    assert [r.id for r in refs] == ["a", "b", "c"]
    assert refs[0].size == 5
    assert refs[0].url.endswith("a.bin")
    again = {r.id: r.fingerprint for r in list_clips(str(tmp_path), "*.bin")}
    assert again == {r.id: r.fingerprint for r in refs}
    (tmp_path / "a.bin").write_bytes(b"changed!")
    assert {r.id: r.fingerprint for r in list_clips(str(tmp_path))}["a"] != again["a"]
    fs = fsspec.filesystem("memory")
    fs.pipe("/clipsmem/x.bin", b"xx")
    mem = list(list_clips("memory:///clipsmem"))
    assert [(r.id, r.url) for r in mem] == [("x", "memory:///clipsmem/x.bin")]
    with pytest.raises(BatchError, match="does not exist"):
        list(list_clips(str(tmp_path / "missing")))
