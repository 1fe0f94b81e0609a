"""The benchmarks' shared edges: where their figures are written (a quick run never replaces a
recorded full run) and the one line, exit code 2, when an extra they need is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    """`_results` and `_extras` as the benchmarks import them (from their folder)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import _extras
    import _results

    return _results, _extras


def test_a_quick_run_never_replaces_a_recorded_full_run(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    results, _ = bench
    recorded = tmp_path / "results" / "deployments.json"
    assert results.save({"rollout": {"failed": 0}}, recorded) == recorded
    quick = results.save({"rollout": {"failed": 1}}, recorded, quick=True)
    assert quick == tmp_path / "results" / "quick" / "deployments.json"
    assert json.loads(recorded.read_text())["rollout"] == {"failed": 0}
    assert json.loads(recorded.read_text())["quick"] is False
    assert json.loads(quick.read_text())["quick"] is True
    # the next quick run replaces the last quick one; asking for quick/ itself stays there
    assert results.save({"rollout": {"failed": 2}}, quick, quick=True) == quick
    assert json.loads(quick.read_text())["rollout"] == {"failed": 2}
    assert json.loads(recorded.read_text())["rollout"] == {"failed": 0}


def test_the_quick_folder_is_not_committed() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "benchmarks/results/quick/deployments.json"],
        cwd=BENCH.parent,
        check=False,
    )
    assert ignored.returncode == 0


def test_extras_are_named_from_pyproject(bench: tuple[ModuleType, ModuleType]) -> None:
    _, extras = bench
    assert extras.extras_of("sglang-router") == ["bench"]
    assert extras.extras_of("numpy") == ["control", "batch"]
    assert extras.extras_of("llama_cpp") == ["engine"]
    assert extras.extras_of("httpx") == []  # a base dependency: no extra to name


def run(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter from the repository root, benchmarks importable."""
    prelude = f"import runpy, sys; sys.path.insert(0, {str(BENCH)!r}); "
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=BENCH.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_benchmark_without_its_extra_says_which_to_install() -> None:
    """numpy made unimportable, as in an install without the control extra."""
    script = BENCH / "scheduler_scale.py"
    done = run(
        f"sys.modules['numpy'] = None; sys.argv = [{str(script)!r}]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')",
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1  # one line, no traceback
    assert "benchmarks/scheduler_scale.py needs numpy, from the control extra" in done.stderr
    assert "-m pip install -e" in done.stderr
    assert "[control]" in done.stderr


def test_the_peer_routers_missing_name_the_bench_extra(tmp_path: Path) -> None:
    """The fleet benchmark in a venv whose bin/ lacks sglang-router and vllm-router: it stops
    before starting anything."""
    script = BENCH / "gateway_fleet.py"
    done = run(
        f"import _extras; from pathlib import Path; _extras.BIN = Path({str(tmp_path)!r}); "
        f"sys.argv = [{str(script)!r}, '--quick']; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')",
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "benchmarks/gateway_fleet.py needs sglang-router, from the bench extra" in done.stderr
    assert "[bench]" in done.stderr
