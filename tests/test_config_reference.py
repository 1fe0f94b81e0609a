"""`gpuplane config reference`: the Markdown table the docs site's configuration page holds
(rendered there from the same function at build time, so no copy can go stale)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from gpuplane.cli.main import app

_CELL_EDGE = re.compile(r"(?<!\\)\|")  # a `|` that is not escaped: where a cell ends


def _reference() -> list[str]:
    result = CliRunner().invoke(app, ["config", "reference"])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_every_row_has_the_header_s_four_columns() -> None:
    lines = _reference()
    assert lines[0] == "| key | type | default | meaning |"
    widths = {line: len(_CELL_EDGE.findall(line)) for line in lines}
    assert [line for line, n in widths.items() if n != 5] == []
    assert any(line.startswith("| `batch.gpus` | int or None |  | ") for line in lines)


def test_a_required_field_reads_required() -> None:
    lines = _reference()
    assert not [line for line in lines if "PydanticUndefined" in line]
    rows = {line.split(" | ")[0].removeprefix("| "): line.split(" | ") for line in lines[2:]}
    assert rows["`models[].name`"][2] == "required"
    assert rows["`control.clusters[].name`"][2] == "required"
    assert rows["`models[].engine`"][2] == "`'llamacpp'`"


def test_a_type_reads_without_its_constraints() -> None:
    rows = {line.split(" | ")[0]: line for line in _reference()}
    prices = rows["| `audit.prices`"]
    assert "| dict[str, float] |" in prices, prices
    assert "FieldInfo" not in "\n".join(rows.values())
