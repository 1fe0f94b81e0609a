"""The one reader of secret files (`gpuplane.secrets.read_secret`) every secret setting uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplane.errors import ConfigError
from gpuplane.secrets import read_secret


class Refused(Exception):
    pass


def test_reads_the_secret_without_the_whitespace_around_it(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  s3cret \n")
    assert read_secret(path, "the token") == "s3cret"
    assert read_secret(str(path), "the token", strip=False) == "  s3cret "


def test_an_unreadable_or_empty_file_is_refused_with_the_callers_error(tmp_path: Path) -> None:
    with pytest.raises(Refused, match=r"the token file .*absent \(a flag\) cannot be read"):
        read_secret(tmp_path / "absent", f"the token file {tmp_path / 'absent'} (a flag)", Refused)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="is empty; write the secret in it"):
        read_secret(empty, f"{empty}")
