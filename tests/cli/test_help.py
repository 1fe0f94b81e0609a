"""`--help` of every `gpuplane` command reads whole in an 80-column terminal."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpuplane.cli.main import app

_CUT = re.compile(r"-[\w-]*…")  # an option name the help table cut short


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():  # a group's subcommands
        yield from _commands(sub, (*path, name))


def _command_at(path: tuple[str, ...]) -> Any:
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


COMMANDS = list(_commands(typer.main.get_command(app)))


def test_the_walk_reaches_nested_commands() -> None:
    assert ("engine", "sim") in COMMANDS
    assert ("batch", "cache", "ls") in COMMANDS
    assert len(COMMANDS) > 30


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_fits_80_columns_with_whole_option_names(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    out = result.output
    assert _CUT.findall(out) == []
    assert "<bool>" not in out
    assert [line for line in out.splitlines() if len(line) > 80] == []
    command = _command_at(path)
    ctx = command.context_class(command, info_name=path[-1] if path else "gpuplane")
    for param in command.params:
        record = param.get_help_record(ctx)  # (the names as the help prints them, the help)
        if param.param_type_name != "option" or record is None:  # arguments; hidden options
            continue
        assert record[0] in out  # every name whole, on one line
        rest = re.sub(r"(^|[ ,/]+)-[\w-]+", "", record[0])  # after the names: the type
        if param.is_flag:
            assert rest == "", record[0]
        else:
            assert rest.strip(), record[0]


GROUPS = [p for p in COMMANDS if getattr(_command_at(p), "commands", None)]


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(p) or "gpuplane")
def test_a_groups_command_summaries_are_whole_sentences(path: tuple[str, ...]) -> None:
    """Click cuts a summary longer than the line with `...`: each command's docstring opens
    with a short sentence, which is its summary in the group's list."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    listed = result.output.split("Commands:\n", 1)[1].splitlines()
    summaries = [line.split(maxsplit=1)[1] for line in listed if line.startswith("  ")]
    assert len(summaries) == len(_command_at(path).commands)
    for summary in summaries:
        assert not summary.endswith("..."), summary
        assert summary.endswith((".", ")")), summary
