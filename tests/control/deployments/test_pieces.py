"""The controller's pieces (`instances`, `loads`, `spread`, `watch`) are classes and functions
with their own state, handed to the controller: none imports it, lazily or not, so no circle
controller <-> piece can come back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DEPLOYMENTS = Path(__file__).parents[3] / "src" / "gpuplane" / "control" / "deployments"


@pytest.mark.parametrize("piece", ["instances", "loads", "spread", "watch"])
def test_a_piece_does_not_import_the_controller(piece: str) -> None:
    tree = ast.parse((DEPLOYMENTS / f"{piece}.py").read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "gpuplane.control.deployments.controller" not in imported


def test_the_controller_fits_one_screen_budget() -> None:
    """The issue's bound: the controller is at most 300 lines, every module here at most 400."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in DEPLOYMENTS.glob("*.py")}
    assert sizes["controller.py"] <= 300
    assert {name: n for name, n in sizes.items() if n > 400} == {}
