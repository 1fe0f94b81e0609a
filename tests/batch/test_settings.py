"""The `batch:` section of gpuplane.yaml: the flags' old defaults, a file's value used, a flag
over the file, and a wrong key or value refused with what to write instead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
import yaml
from fsspec.implementations.local import LocalFileSystem
from typer.testing import CliRunner

from gpuplane.batch.cache import parse_size
from gpuplane.batch.driver import RunOptions
from gpuplane.batch.packing import declared_devices
from gpuplane.batch.settings import BatchConfig
from gpuplane.cli.batch import app
from gpuplane.cli.main import app as main_app
from gpuplane.config import parse_settings
from gpuplane.errors import ConfigError
from tests.helpers.batch import TOY, write_clips

FLAG_DEFAULTS: dict[str, Any] = {
    "cache_url": ".gpuplane/cache",
    "runs_dir": ".gpuplane/runs",
    "pattern": "*",
    "gpus": None,
    "gpu_mem_mib": 81920,
    "runner": "local",
    "ray_address": None,
    "ray_token_file": None,
    "threads": False,
    "cpu_slots": None,
    "storage_options": {},
    "prefetch_items": 8,
    "prefetch_bytes": "1G",
    "io_workers": 4,
    "calibrate": False,
    "verify_clips": False,
    "report": True,
    "progress": True,
}
"""What `gpuplane batch run` and `plan` took before the section existed."""


def test_the_section_defaults_are_what_the_flags_defaulted_to() -> None:
    assert BatchConfig().model_dump() == FLAG_DEFAULTS
    assert parse_settings({}).batch == BatchConfig()
    # the driver's own defaults, for callers without the CLI, agree with the section's
    opts, cfg = RunOptions(Path("."), declared_devices(1)), BatchConfig()
    assert (opts.prefetch_items, opts.prefetch_bytes, opts.io_workers) == (
        cfg.prefetch_items, parse_size(cfg.prefetch_bytes), cfg.io_workers)  # fmt: skip
    assert (opts.calibrate, opts.verify_clips) == (cfg.calibrate, cfg.verify_clips)


def _config(tmp_path: Path, batch: dict[str, Any]) -> Path:
    path = tmp_path / "gpuplane.yaml"
    path.write_text(yaml.safe_dump({"batch": batch}))
    return path


def _run(*args: str) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["run", TOY, "-o", "json", *args])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.output)
    return doc


def test_the_file_sets_what_a_flag_leaves_unset_and_a_flag_overrides_the_file(
    tmp_path: Path,
) -> None:
    clips = write_clips(tmp_path / "clips", 3)
    config = _config(tmp_path, {"cache_url": str(tmp_path / "file-cache"), "threads": True,
                                "runs_dir": str(tmp_path / "runs"), "report": False})  # fmt: skip
    common = ["--clips", str(clips), "--config", str(config)]
    first = _run(*common)
    assert first["cache_url"] == str(tmp_path / "file-cache")
    assert Path(first["out_dir"]).parent == tmp_path / "runs"  # no --out: under runs_dir
    assert first["runner"]["threads"] is True
    assert "report" not in first
    assert (tmp_path / "file-cache" / "perception").is_dir()
    flags = ["--cache", str(tmp_path / "flag-cache"), "--no-threads", "--report", "--cpu-slots",
             "1", "--out", str(tmp_path / "other")]  # fmt: skip
    second = _run(*common, *flags)
    assert second["cache_url"] == str(tmp_path / "flag-cache")
    assert second["stages"]["perception"]["computed"] == 3  # not the file's cache: a fresh one
    assert second["runner"]["threads"] is False
    assert Path(second["report"]).is_file()
    du = CliRunner().invoke(app, ["cache", "du", "--config", str(config), "-o", "json"])
    assert du.exit_code == 0, du.output
    assert json.loads(du.output)["perception"]["entries"] == 3  # the file's cache, not ./.gpuplane


class OptionsFS(LocalFileSystem):  # type: ignore[misc]
    """The local filesystem as `optsfs://`, remembering the storage options it was made with."""

    protocol = ("optsfs",)
    made_with: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **options: Any) -> None:
        OptionsFS.made_with.append(options)
        super().__init__()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return LocalFileSystem._strip_protocol(str(path).removeprefix("optsfs://"))


def test_a_flag_overrides_the_file_s_storage_options_key_by_key(tmp_path: Path) -> None:
    fsspec.register_implementation("optsfs", OptionsFS, clobber=True)
    clips = write_clips(tmp_path / "clips", 2)
    config = _config(tmp_path, {"storage_options": {"region": "file", "retries": 3}})
    common = ["--clips", f"optsfs://{clips}", "--config", str(config), "--threads", "--no-report"]
    _run(*common, "--out", str(tmp_path / "a"))
    assert OptionsFS.made_with[-1] == {"region": "file", "retries": 3}
    done = _run(*common, "--out", str(tmp_path / "b"), "--storage-option", "region=flag")
    assert OptionsFS.made_with[-1] == {"region": "flag", "retries": 3}
    assert done["clips"]["done"] == 2


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({"cache": "x"}, r"unknown key 'batch.cache' \(did you mean 'cache_url'\?\)"),
        ({"runner": "rey"}, r"batch.runner: unknown runner 'rey' \(did you mean 'ray'\?\)"),
        ({"prefetch_bytes": "lots"}, r"batch.prefetch_bytes: size 'lots': use .* 500M, 2G"),
        ({"prefetch_items": 0}, r"batch.prefetch_items: .*greater than or equal to 1"),
    ],
)
def test_a_wrong_key_or_value_in_the_file_says_what_to_write(
    tmp_path: Path, batch: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_settings({"batch": batch})
    clips = write_clips(tmp_path / "clips", 1)
    args = ["run", TOY, "--clips", str(clips), "--config", str(_config(tmp_path, batch)),
            "--out", str(tmp_path / "run")]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert "batch." in res.output
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_the_config_reference_lists_the_batch_keys() -> None:
    res = CliRunner().invoke(main_app, ["config", "reference"])
    assert res.exit_code == 0, res.output
    for key in FLAG_DEFAULTS:
        assert f"`batch.{key}`" in res.stdout


def test_reading_a_config_file_needs_none_of_the_batch_tier_s_dependencies(tmp_path: Path) -> None:
    config = _config(tmp_path, {"cache_url": "s3://bucket/cache", "prefetch_items": 4})
    code = (
        "import sys; from gpuplane.config import load_settings\n"
        "s = load_settings(sys.argv[1]); assert s.batch.prefetch_items == 4\n"
        "print(sorted(m for m in ('fsspec', 'numpy', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
