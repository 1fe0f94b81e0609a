"""The openb trace replay: tuning the arrivals, the protocol's measurements, the CLI."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from gpuplane.cli.main import app
from gpuplane.control.lab.simulate import (
    load_nodes,
    load_pods,
    parse_seeds,
    run_seed,
    simulate,
    tuned_pods,
)
from gpuplane.control.scheduler import Request, Snapshot, policy_class, schedule
from gpuplane.errors import ConfigError

OPENB = Path(__file__).resolve().parents[4] / "shared" / "data" / "openb"

NODES = """sn,cpu_milli,memory_mib,gpu,model
node-0,32000,131072,2,T4
node-1,32000,131072,2,T4
node-2,64000,262144,4,V100M16
node-3,16000,65536,1,P100
"""

HEAD = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
PODS = (
    HEAD
    + "deletion_time,scheduled_time\n"
    + "\n".join(
        f"pod-{i},{cpu},{mem},{g},{milli},{spec},LS,Running,0,1,0"
        for i, (cpu, mem, g, milli, spec) in enumerate(
            [
                (4000, 8192, 1, 500, ""),
                (2000, 4096, 1, 250, ""),
                (8000, 16384, 1, 1000, ""),
                (8000, 16384, 2, 1000, "V100M16"),
                (1000, 2048, 0, 0, "T4"),
                (6000, 12288, 1, 700, "T4|P100"),
            ]
        )
    )
)


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS + "\n")
    return tmp_path / "nodes.csv", tmp_path / "pods.csv"


def test_trace_rows_map_to_requests(trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(trace[0]), load_pods(trace[1])
    assert [len(n.devices) for n in nodes] == [2, 2, 4, 1]
    assert nodes[2].gpu_model == "V100M16"
    share, whole, multi, cpu_only, spec = pods[0], pods[2], pods[3], pods[4], pods[5]
    assert (share.gpus, share.gpu_milli, share.gpu_mem_mib) == (0, 500, None)
    assert (whole.gpus, whole.gpu_milli) == (1, 0)
    assert multi.gpus == 2
    assert multi.selector.gpu_models == {"V100M16"}
    assert not cpu_only.is_gpu
    assert not cpu_only.selector.gpu_models  # CPU-only pods ignore gpu_spec
    assert spec.selector.gpu_models == {"T4", "P100"}


def test_tuned_pods_keep_every_pod_and_stay_within_the_target() -> None:
    pods = [Request(f"p{i}", gpu_milli=100 * (i % 9 + 1)) for i in range(50)]
    capacity = 20_000
    out = tuned_pods(pods, capacity, 1.3, np.random.default_rng(42))
    names = {p.job_id for p in out}
    assert {p.job_id for p in pods} <= names
    assert len(names) == len(out)
    assert sum(p.gpu_demand_milli for p in out) <= 1.3 * capacity
    assert sum(p.gpu_demand_milli for p in out) > 1.3 * capacity - 1000
    again = tuned_pods(pods, capacity, 1.3, np.random.default_rng(42))
    assert [p.job_id for p in again] == [p.job_id for p in out]
    assert [p.job_id for p in out[:50]] != [p.job_id for p in pods]  # shuffled


def test_a_replay_measures_allocation_and_failures(trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(trace[0]), load_pods(trace[1])
    result = run_seed(nodes, pods, "frag", seed=42, tune=1.3)
    assert 0 < result.alloc_ratio_100 <= result.alloc_ratio_final <= 100
    assert result.placed + sum(result.failures.values()) == result.pods
    assert result.failures  # 130 % of the demand cannot all fit
    assert run_seed(nodes, pods, "frag", seed=42, tune=1.3).alloc_ratio_final == (
        result.alloc_ratio_final
    )


@pytest.mark.parametrize("policy", ["frag", "best-fit", "random"])
def test_failed_shapes_are_not_rescheduled_yet_nothing_changes(
    trace: tuple[Path, Path], policy: str
) -> None:
    """The replay skips shapes that already failed (no departures: free resources only
    shrink); the placements, ratios and failure reasons equal a replay that tries every pod."""
    nodes, pods = load_nodes(trace[0]), load_pods(trace[1])
    got = run_seed(nodes, pods, policy, seed=7, tune=3.0)
    snap = Snapshot(nodes)
    capacity = int(snap.dev_milli_cap.sum())
    arrivals = tuned_pods(pods, capacity, 3.0, np.random.default_rng(7))
    pol = policy_class(policy).for_mix(pods)
    ties = np.random.default_rng([7, 1])
    failures: Counter[str] = Counter()
    allocated = 0
    for pod in arrivals:
        decision = schedule(snap, pod, pol, ties)
        if decision.placement is not None:
            snap.commit(decision.placement)
            allocated += pod.gpu_demand_milli
        else:
            reason = decision.primary_reason
            assert reason is not None
            failures[reason.code.value] += 1
    assert sum(failures.values()) > len({p.shape for p in arrivals})  # shapes did fail twice
    assert got.failures == dict(failures)
    assert got.placed == len(arrivals) - sum(failures.values())
    assert got.alloc_ratio_final == pytest.approx(100.0 * allocated / capacity)


def test_simulate_averages_over_seeds(trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(trace[0]), load_pods(trace[1])
    seen: list[int] = []
    result = simulate(nodes, pods, "best-fit", [1, 2, 3], 1.3, lambda r: seen.append(r.seed))
    assert seen == [1, 2, 3]
    doc = result.as_dict()
    assert doc["alloc_ratio_130"] == pytest.approx(
        np.mean([s.alloc_ratio_final for s in result.seeds]), abs=1e-3
    )
    assert set(doc) >= {"alloc_ratio_100", "alloc_ratio_130", "failures_by_cause", "run_time_s"}


def test_parse_seeds() -> None:
    assert parse_seeds("42-45") == [42, 43, 44, 45]
    assert parse_seeds("1,3,5-6") == [1, 3, 5, 6]
    with pytest.raises(ConfigError):
        parse_seeds("a-b")


def test_cli_prints_one_json_object(trace: tuple[Path, Path]) -> None:
    args = ["simulate", "openb", "--nodes", str(trace[0]), "--pods", str(trace[1])]
    result = CliRunner().invoke(app, [*args, "--seeds", "42-43", "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["policy"] == "frag"
    assert doc["seeds"] == [42, 43]
    assert 0 < doc["alloc_ratio_130"] <= 100
    table = CliRunner().invoke(app, [*args, "--seeds", "42", "--policy", "random"])
    assert table.exit_code == 0
    assert "alloc_ratio_130" in table.stdout
    bad = CliRunner().invoke(app, [*args, "--policy", "first-fit"])
    assert bad.exit_code == 2
    assert "unknown scheduling policy" in bad.output
    assert "valid: " in bad.output


@pytest.mark.skipif(not OPENB.is_dir(), reason="the openb trace is not next to the checkout")
def test_replay_on_a_slice_of_the_real_trace() -> None:
    nodes = load_nodes(OPENB / "openb_node_list_gpu_node.csv")[:200]
    pods = load_pods(OPENB / "openb_pod_list_default.csv")[:1500]
    frag = run_seed(nodes, pods, "frag", seed=42)
    rand = run_seed(nodes, pods, "random", seed=42)
    assert frag.alloc_ratio_final > rand.alloc_ratio_final


def test_cli_reads_the_trace_from_its_folder(trace: tuple[Path, Path], tmp_path: Path) -> None:
    data = tmp_path / "openb"
    data.mkdir()
    trace[0].rename(data / "openb_node_list_gpu_node.csv")
    trace[1].rename(data / "openb_pod_list_default.csv")
    by_flag = CliRunner().invoke(app, ["simulate", "openb", "--data", str(data), "-o", "yaml"])
    assert by_flag.exit_code == 0, by_flag.output
    assert yaml.safe_load(by_flag.stdout)["seeds"] == list(range(42, 52))
    by_env = CliRunner().invoke(
        app, ["simulate", "openb", "--seeds", "1", "-o", "json"], env={"GPUPLANE_OPENB": str(data)}
    )
    assert by_env.exit_code == 0, by_env.output
    assert json.loads(by_env.stdout)["seeds"] == [1]


def test_cli_without_the_trace_says_how_to_fetch_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a clone: neither data/openb nor ../shared/data/openb
    monkeypatch.delenv("GPUPLANE_OPENB", raising=False)
    result = CliRunner().invoke(app, ["simulate", "openb", "--seeds", "1"])
    assert result.exit_code == 2
    out = " ".join(result.output.split())
    assert "data/openb/openb_node_list_gpu_node.csv" in out
    assert "curl -fL --create-dirs -o data/openb/openb_pod_list_default.csv https://" in out
    assert "cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv" in out
    assert "--data DIR" in out


def test_the_deprecated_json_flag_is_o_json(trace: tuple[Path, Path]) -> None:
    args = ["simulate", "openb", "--nodes", str(trace[0]), "--pods", str(trace[1])]
    result = CliRunner().invoke(app, [*args, "--seeds", "42", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["seeds"] == [42]
    assert "use -o json" in result.stderr
