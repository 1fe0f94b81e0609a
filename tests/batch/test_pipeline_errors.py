"""A mistyped pipeline or stage name on `gpuplane batch run|plan` says what was meant."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpuplane.cli.main import app
from tests.helpers.batch import TOY

_FORMS = "pass a directory with pipeline.py, a .py file, or module:attr"


def _fails(*args: str) -> str:
    result = CliRunner().invoke(app, ["batch", *args], env={"COLUMNS": "400"})
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return " ".join(result.output.split())


def test_a_path_that_does_not_exist_is_named(tmp_path: Path, clips: Path) -> None:
    missing = tmp_path / "pipelines" / "mine"
    out = _fails("run", str(missing), "--clips", str(clips))
    assert f"pipeline '{missing}' is neither a directory or .py file" in out
    assert _FORMS in out
    out = _fails("plan", str(tmp_path / "mine.py"), "--clips", str(clips))
    assert f"pipeline file {tmp_path / 'mine.py'} does not exist; {_FORMS}" in out


def test_a_directory_without_pipeline_py_says_so(tmp_path: Path, clips: Path) -> None:
    out = _fails("run", str(tmp_path), "--clips", str(clips))
    assert f"pipeline directory {tmp_path} holds no pipeline.py; {_FORMS}" in out


def test_a_mistyped_attribute_names_the_nearest(clips: Path) -> None:
    out = _fails("plan", f"{TOY}:buld_pipeline", "--clips", str(clips))
    assert "unknown pipeline attribute 'buld_pipeline' (did you mean 'build_pipeline'?)" in out


def test_an_unknown_stage_version_lists_the_stages(tmp_path: Path, clips: Path) -> None:
    args = ("--clips", str(clips), "--stage-version", "perceptoin=2")
    for out in (
        _fails("run", TOY, *args, "--out", str(tmp_path / "run")),
        _fails("plan", TOY, *args),
    ):
        assert "unknown stage 'perceptoin' (did you mean 'perception'?)" in out
        assert "valid: parity_check, perception, size_check, sum_check" in out
