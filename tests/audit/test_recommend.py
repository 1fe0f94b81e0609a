"""Recommended slices: the grid, batch sizing on the max, MIG profiles, and the replay."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gpuplane.audit.pipeline import run_audit
from gpuplane.audit.recommend import Recommendation, grid_mem_mib, replay
from gpuplane.audit.settings import AuditSettings
from tests.audit.audit_helpers import CARD, concat, series

GIB = 1024
N = 600


def _recs(table: pa.Table, **cfg: object) -> dict[str, Recommendation]:
    recs: dict[str, Recommendation] = run_audit(
        table, None, AuditSettings.model_validate(cfg)
    ).recommendations
    return recs


def test_memory_rounds_up_to_the_eighth_card_grid() -> None:
    s = AuditSettings()
    assert grid_mem_mib(1.0, CARD, s) == 10 * GIB  # at least one step
    assert grid_mem_mib(10 * GIB, CARD, s) == 10 * GIB
    assert grid_mem_mib(10 * GIB + 1, CARD, s) == 20 * GIB
    assert grid_mem_mib(200 * GIB, CARD, s) == CARD  # never more than the card


def test_inference_p99_times_headroom_batch_the_max_and_compute_p95() -> None:
    rng = np.random.default_rng(0)
    mem = rng.uniform(6 * GIB, 7 * GIB, N)
    mem[5] = 11 * GIB  # one spike, under 1 % of the samples
    compute = rng.uniform(0.05, 0.12, N)
    recs = _recs(
        concat(
            series("svc", mem, compute, card="n0/0"),
            series("job", mem, compute, card="n0/1", kind="batch"),
        )
    )
    svc, job = recs["svc"], recs["job"]
    assert svc.mem_mib == 20 * GIB  # p99 ~7 GiB x 1.2 = 8.4, raised to cover the 11 GiB peak
    assert job.mem_mib == 20 * GIB  # max 11 x 1.2 = 13.2 -> 20
    assert svc.cores_pct == 15  # p95 ~0.12 rounded up to the 5 % step
    assert svc.basis_mib < job.basis_mib


def test_a_need_that_rounds_to_the_card_keeps_the_whole_card() -> None:
    rec = _recs(series("big", [75 * GIB] * N, [0.3] * N))["big"]
    assert rec.whole
    assert rec.mem_mib == CARD
    assert rec.cores_pct == 100


def test_mig_profiles_pick_the_smallest_that_holds_memory_and_compute() -> None:
    cfg = {"mig_profiles": ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]}
    recs = _recs(
        concat(
            series("tiny", [5 * GIB] * N, [0.1] * N, card="n0/0"),
            series("busy", [5 * GIB] * N, [0.35] * N, card="n0/1"),  # needs 3/7 of the compute
        ),
        **cfg,
    )
    assert recs["tiny"].profile == "1g.10gb"
    assert recs["busy"].profile == "3g.40gb"


def test_replay_finds_no_sample_above_a_recommended_limit() -> None:
    rng = np.random.default_rng(1)
    tables = [
        series(f"w{i}", rng.lognormal(np.log(4 * GIB), 0.6, N).clip(0, CARD),
               rng.uniform(0, 0.3, N), card=f"n0/{i}")
        for i in range(6)
    ]  # fmt: skip
    samples = concat(*tables)
    recs = _recs(samples)
    result = replay(samples, recs.values())
    assert result.samples == samples.num_rows
    assert result.exceeded == 0
    assert result.over_memory == {}
    # the check itself can fail: a limit one MiB under the peak is caught
    peak = float(pc.max(samples.filter(pc.field("workload") == "w0")["mem_used_mib"]).as_py())
    from dataclasses import replace

    tight = replace(recs["w0"], mem_mib=int(peak) - 1)
    assert replay(samples, [tight]).over_memory["w0"] >= 1


def test_audit_settings_refuse_bad_values_saying_what_is_valid() -> None:
    from gpuplane.config import parse_settings
    from gpuplane.errors import ConfigError

    assert parse_settings({"audit": {"headroom": 1.5}}).audit.headroom == 1.5
    with pytest.raises(ConfigError, match=r"did you mean 'headroom'"):
        parse_settings({"audit": {"headrom": 1.5}})
    with pytest.raises(ConfigError, match=r"'1g10gb' is not '<g>g.<GiB>gb'"):
        parse_settings({"audit": {"mig_profiles": ["1g10gb"]}})
    with pytest.raises(ConfigError, match=r"unknown scheduling policy 'fragg'.*did you mean"):
        parse_settings({"audit": {"policy": "fragg"}})
