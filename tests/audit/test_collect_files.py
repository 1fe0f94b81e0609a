"""`gpuplane audit collect --source file`: CSV/Parquet import, validated before any is stored."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gpuplane.audit.collect.files import import_files, read
from gpuplane.audit.sample_store import SampleStore
from gpuplane.audit.samples import SampleError, Traffic, to_table
from gpuplane.cli.main import app
from tests.audit.audit_helpers import SAMPLE_T0, sample

HEADER = (
    "time,cluster,node,card,gpu_model,workload,team,kind,card_mem_mib,alloc_mem_mib,"
    "alloc_cores_pct,mem_used_mib,compute_share\n"
)
GOOD = (
    HEADER
    + "2026-12-01T10:00:00Z,c1,n1,n1/0,A100-80GB,job-1,vision,batch,81920,10240,25,5000,0.2\n"
    + "2026-12-01 10:01:00,c1,n1,n1/0,A100-80GB,job-1,vision,batch,81920,,,nan,\n"
    + "2026-12-01T11:01:00+01:00,c1,n1,n1/1,A100-80GB,,,,81920,,,0,0\n"
)
runner = CliRunner()


def test_csv_reads_times_empty_fields_and_nan_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(GOOD)
    rows = read(path).to_pylist()
    assert [r["time"].isoformat() for r in rows] == [
        "2026-12-01T10:00:00+00:00",
        "2026-12-01T10:01:00+00:00",
        "2026-12-01T10:01:00+00:00",
    ]
    assert (rows[1]["alloc_mem_mib"], rows[1]["mem_used_mib"], rows[1]["compute_share"]) == (
        None,
        None,
        None,
    )
    assert rows[2]["workload"] == ""  # nothing allocated on that card


def test_a_bad_csv_names_file_column_row_and_line_and_stores_nothing(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_text(GOOD)
    bad.write_text(GOOD + "2026-12-01T10:03:00Z,c1,n1,n1/0,A100-80GB,j,t,batch,81920,,,10,1.7\n")
    store = SampleStore(tmp_path / "store")
    store.append(to_table([sample()]))
    with pytest.raises(SampleError, match=r"bad\.csv: column 'compute_share' row 3: .*\(line 5\)"):
        import_files([good, bad], store)
    assert store.scan().num_rows == 1  # neither file landed


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (HEADER.replace(",team", ",teem"), r"unknown column\(s\) teem"),
        (HEADER.replace(",compute_share", ""), r"missing column\(s\) compute_share"),
        (
            HEADER + "yesterday,c,n,x,m,,,,81920,,,,\n",
            "column 'time' row 0: cannot read 'yesterday'",
        ),
    ],
)
def test_malformed_files_say_what_is_wrong(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "x.csv"
    path.write_text(text)
    with pytest.raises(SampleError, match=match):
        read(path)


def test_parquet_samples_and_traffic_import(tmp_path: Path) -> None:
    samples_file, traffic_file = tmp_path / "s.parquet", tmp_path / "t.parquet"
    pq.write_table(to_table([sample(), sample(1)]), samples_file)
    rows = [Traffic(SAMPLE_T0, "chat", "http://i0", 4, 40, 20, 3.5)]
    pq.write_table(to_table(rows), traffic_file)
    store = SampleStore(tmp_path / "store")
    assert import_files([samples_file], store) == 2
    result = runner.invoke(
        app,
        [
            "audit",
            "collect",
            "-s",
            "file",
            "--traffic",
            "--out",
            str(tmp_path / "tr"),
            str(traffic_file),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "imported 1 rows from 1 file(s)" in result.output


def test_cli_refuses_a_bad_file_with_the_reason_and_a_non_zero_exit(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(GOOD.replace(",0.2\n", ",2\n"))
    out = tmp_path / "store"
    result = runner.invoke(app, ["audit", "collect", "-s", "file", "--out", str(out), str(bad)])
    assert result.exit_code == 1
    assert "column 'compute_share' row 0: must be within 0..1 (line 2)" in result.output
    assert "nothing was imported" in result.output
    assert SampleStore(out).scan().num_rows == 0
    result = runner.invoke(app, ["audit", "collect", "-s", "file", "--out", str(out)])
    assert result.exit_code == 1
    assert "needs the files to import" in result.output
