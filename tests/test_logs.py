"""`gpuplane.logs.configure`: what a user sees of a log line on a terminal and when piped."""

from __future__ import annotations

import io
import json
import logging

import pytest

from gpuplane import logs


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_line_on_a_terminal_shows_its_level_once(monkeypatch: pytest.MonkeyPatch) -> None:
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    logs.configure()
    logging.getLogger("gpuplane.control").warning("careful with %s", "this")
    line = err.getvalue()
    assert "careful with this" in line
    assert line.count("WARNING") == 1, line
    assert "gpuplane.control:" not in line


def test_piped_each_line_is_one_json_event_and_the_level_filters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    logs.configure(logging.WARNING)  # `gpuplane up` without -v
    logging.getLogger("gpuplane.control").info("detail")
    logging.getLogger("gpuplane.control").warning("careful")
    assert [json.loads(line)["message"] for line in err.getvalue().splitlines()] == ["careful"]
