"""`gpuplane job` against a real API in a thread: times, `-o wide`, `--watch`, `--wait`, filters,
the devices of a finished job, and shell completion of names."""

from __future__ import annotations

import io
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpuplane.cli import job as job_cli
from gpuplane.cli._control_common import fitting_columns
from gpuplane.control.service.service import ControlService
from tests.control.api_server import admin_of, cli, cli_app, serving
from tests.control.svc_helpers import job, wait_state

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
QUICK = ["python", "-c", "print('hi')"]


@pytest.fixture
def url(service: ControlService) -> Iterator[str]:
    with serving(service) as u:
        yield u


def finished(service: ControlService, command: list[str] = QUICK) -> str:
    job_id = str(service.submit(job("quick", command=command, gpus=1))["id"])
    wait_state(service, job_id, "succeeded", "failed")
    return job_id


def spec_file(tmp_path: Path, command: list[str]) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job("waited", command=command, gpus=1)))
    return str(path)


def test_times_are_iso_8601_in_json_and_yaml(service: ControlService, url: str) -> None:
    job_id = finished(service)
    code, out = cli(url, "job", "list", "-o", "json")
    assert code == 0, out
    (listed,) = json.loads(out)
    for key in ("created_at", "started_at", "finished_at"):
        assert ISO.match(listed[key]), listed[key]
    code, out = cli(url, "job", "describe", job_id, "-o", "yaml")
    assert ISO.match(yaml.safe_load(out)["finished_at"])


def test_tables_show_times_relative_to_now() -> None:
    from gpuplane.cli._control_common import relative

    assert relative(100.0, now=280.0) == "3m ago"
    assert relative(7300.0, now=100.0) == "in 2h"
    assert relative(None, now=100.0) == "-"


def test_wide_adds_where_it_ran_when_and_the_exit_code(service: ControlService, url: str) -> None:
    job_id = finished(service, ["python", "-c", "raise SystemExit(7)"])
    code, out = cli(url, "job", "list")
    assert code == 0, out
    assert "DEVICES" not in out
    code, out = cli(url, "job", "list", "-o", "wide")
    assert code == 0, out
    header, row = out.splitlines()[:2]
    wide = ["CLUSTER", "NODE", "DEVICES", "STARTED", "FINISHED", "EXIT"]
    assert header.split() == ["ID", "TEAM", "STATE", "PRIO", "GPU", "WHERE", "AGE", *wide, "REASON"]
    assert row.startswith(job_id)
    for cell in (" local ", " n0 ", " 0 ", " 7 "):
        assert cell in row


def test_a_finished_job_shows_the_devices_it_ran_on(service: ControlService, url: str) -> None:
    job_id = finished(service)
    code, out = cli(url, "job", "describe", job_id, "-o", "json")
    assert code == 0, out
    described = json.loads(out)
    assert described["state"] == "succeeded"
    assert described["devices"] == [0]
    code, out = cli(url, "job", "list")
    assert "local/n0 [0]" in out


def test_watch_prints_a_json_line_per_change_until_ctrl_c(
    service: ControlService, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = str(service.submit(job("first", gpus=1))["id"])
    polls: list[float] = []

    def pause(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 1:
            service.submit(job("second", gpus=1))
        elif len(polls) == 3:  # the second poll saw no change
            raise KeyboardInterrupt

    monkeypatch.setattr(job_cli, "_pause", pause)
    code, out = cli(url, "job", "list", "--watch", "--interval", "5", "-o", "json")
    assert code == 0, out
    lines = [json.loads(line) for line in out.splitlines()]
    assert [j["name"] for j in lines] == ["first", "second"]
    assert lines[0]["id"] == first
    assert polls == [5.0, 5.0, 5.0]


def test_watch_re_renders_the_table_and_bounds_the_interval(
    service: ControlService, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    service.submit(job("first", gpus=1))
    polls: list[float] = []

    def pause(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 1:
            service.submit(job("second", gpus=1))
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(job_cli, "_pause", pause)
    code, out = cli(url, "job", "list", "--watch")
    assert code == 0, out
    assert out.count("REASON") == 2  # rendered once, then again when `second` came
    assert "second" in out.split("REASON")[-1]
    code, out = cli(url, "job", "list", "--watch", "--interval", "0.01")
    assert code == 2
    assert "--interval" in out


def test_submit_wait_exits_with_the_jobs_exit_code(
    service: ControlService, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def pause(_: float) -> None:
        service.tick()
        time.sleep(0.05)

    monkeypatch.setattr(job_cli, "_pause", pause)
    spec = spec_file(tmp_path, ["python", "-c", "raise SystemExit(3)"])
    code, out = cli(url, "job", "submit", spec, "--wait")
    assert code == 3, out
    assert "failed" in out
    spec = spec_file(tmp_path, QUICK)
    code, out = cli(url, "job", "submit", spec, "--wait", "-o", "json")
    assert code == 0, out


def test_submit_wait_streams_the_jobs_output_then_its_final_state(
    service: ControlService, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `ray job submit` and `sky launch`: the output as it comes, then the end and its code;
    with `-o json` the output goes to stderr and stdout stays one JSON document."""
    polls: list[str] = []  # what the user had seen at each poll

    def pause(_: float) -> None:
        sys.stdout.flush()
        captured = sys.stdout.buffer  # CliRunner's capture: what the user has seen so far
        assert isinstance(captured, io.BytesIO)
        polls.append(captured.getvalue().decode())
        service.tick()
        time.sleep(0.05)

    monkeypatch.setattr(job_cli, "_pause", pause)
    command = ["python", "-u", "-c", "import time; print('one'); time.sleep(2); print('two')"]
    runner = CliRunner()  # stdout and stderr apart
    env = {"GPUPLANE_SERVER": url, "GPUPLANE_TOKEN": admin_of(url)}
    args = ["job", "submit", spec_file(tmp_path, command), "--wait"]
    result = runner.invoke(cli_app, args, env=env)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("job ")
    assert "submitted" in lines[0]
    assert lines[1:] == ["one", "two"]
    assert any(seen.endswith("one\n") for seen in polls)  # streamed before the job ended
    assert re.fullmatch(r"job \S+ succeeded \(exit code 0\)", result.stderr.strip())
    as_json = runner.invoke(cli_app, [*args, "-o", "json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["name"] == "waited"
    assert as_json.stderr.splitlines()[:2] == ["one", "two"]


def test_submit_wait_exits_1_with_the_reason_for_a_job_without_an_exit_code(
    service: ControlService, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def pause(_: float) -> None:
        service.cancel("waited")

    monkeypatch.setattr(job_cli, "_pause", pause)
    code, out = cli(url, "job", "submit", spec_file(tmp_path, ["sleep", "30"]), "--wait")
    assert code == 1, out
    assert "cancelled" in out.splitlines()[-1]


def test_an_unknown_filter_value_is_refused_with_the_valid_ones(url: str) -> None:
    code, out = cli(url, "job", "list", "--state", "pendin")
    assert code == 1
    assert "unknown job state 'pendin' (did you mean 'pending'?)" in out
    assert "valid: admitted, cancelled, failed, pending, running, succeeded" in out
    code, out = cli(url, "job", "list", "--team", "reserch")
    assert code == 1
    assert "unknown team 'reserch' (did you mean 'research'?); valid: research" in out


def complete(url: str, words: str) -> list[str]:
    """What bash would offer after `words` (the last one is the word being completed)."""
    args = words.split(" ")
    result = CliRunner().invoke(
        cli_app,
        [],
        prog_name="gpuplane",
        env={
            "_GPUPLANE_COMPLETE": "complete_bash",
            "COMP_WORDS": f"gpuplane {words}",
            "COMP_CWORD": str(len(args)),
            "GPUPLANE_SERVER": url,
            "GPUPLANE_TOKEN": admin_of(url),
        },
    )
    assert result.exit_code == 0, result.output
    return [line for line in result.output.splitlines() if line]


def test_completion_offers_job_team_and_cluster_names(service: ControlService, url: str) -> None:
    job_id = str(service.submit(job("trainer", gpus=1))["id"])
    other = str(service.submit(job("other", gpus=1))["id"])
    assert complete(url, "job describe tra") == sorted([job_id, "trainer"])  # ids and names
    assert complete(url, "job cancel ") == sorted([job_id, "trainer", other, "other"])
    assert complete(url, "job list --team r") == ["research"]
    assert complete(url, "quota show ") == ["research"]
    assert complete(url, "cluster describe ") == ["local"]


def test_completion_is_silent_when_the_control_plane_is_down() -> None:
    assert complete("http://127.0.0.1:9", "job describe ") == []


def test_a_spec_that_is_not_a_mapping_is_refused_naming_the_file(url: str, tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- name: a\n- name: b\n")
    code, out = cli(url, "job", "submit", str(path))
    assert code == 1
    assert f"{path} holds a YAML list; a job spec is a mapping of its fields" in out
    assert "body" not in out


def test_fitting_columns_drops_the_least_important_until_the_rest_fit() -> None:
    columns = ["ID", "PRIO", "WHERE", "REASON"]
    rows = [["j-0123456789", "0", "local/vm [0,1]", "a long reason " * 10]]
    assert fitting_columns(columns, rows, 200, ("PRIO", "WHERE")) == [0, 1, 2, 3]
    # the last column folds: it needs 24 of its 140 characters
    assert fitting_columns(columns, rows, 60, ("PRIO", "WHERE")) == [0, 1, 2, 3]
    assert fitting_columns(columns, rows, 59, ("PRIO", "WHERE")) == [0, 2, 3]
    assert fitting_columns(columns, rows, 40, ("PRIO", "WHERE")) == [0, 3]
    assert fitting_columns(columns, rows, 10, ("PRIO", "WHERE")) == [0, 3]  # Rich cuts the rest


@pytest.mark.parametrize("wide", [False, True], ids=["table", "wide"])
def test_job_list_fits_80_columns_with_whole_ids_and_the_reason(
    service: ControlService, url: str, wide: bool
) -> None:
    """On an 80-column terminal the table fits: less important columns go first, ids stay
    whole, and the reason folds instead of widening the table."""
    finished(service)
    service.submit(job("hog", gpus=2))  # both cards: the next waits, with a reason
    pending = service.submit({**job("waits-for-the-hog-to-finish", gpus=2), "priority": 5})["id"]
    env = {"GPUPLANE_SERVER": url, "GPUPLANE_TOKEN": admin_of(url), "COLUMNS": "80"}
    args = ["job", "list", *(["-o", "wide"] if wide else [])]
    result = CliRunner().invoke(cli_app, args, env=env)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    assert lines[0].split()[0] == "ID"
    assert lines[0].split()[-1] == "REASON"
    assert any(line.startswith(pending + " ") for line in lines)  # the id whole
    assert "…" not in "".join(line.split()[0] for line in lines[1:] if line[:1] != " ")
    wide_out = CliRunner().invoke(cli_app, args, env={**env, "COLUMNS": "250"}).output
    assert max(len(line) for line in wide_out.splitlines()) > 80  # room: nothing dropped


def test_a_job_reference_never_reaches_another_route(service: ControlService, url: str) -> None:
    """`job cancel ../clusters/X/cordon?x=` once cordoned cluster X: a reference is one path
    segment, encoded once; one holding '/' (or '.', '..') is refused before any request."""
    code, out = cli(url, "cluster", "list", "-o", "json")
    assert code == 0, out
    name = json.loads(out)[0]["name"]
    for ref in (f"../clusters/{name}/cordon?x=", "..", "a/b"):
        code, out = cli(url, "job", "cancel", ref)
        assert code == 1
        assert "is not a valid name or id" in out, out
    code, out = cli(url, "cluster", "describe", name, "-o", "json")
    assert code == 0, out
    assert not json.loads(out)["cordoned"]


def test_api_paths_encode_each_segment_once() -> None:
    from gpuplane.control.client import ClientError, api_path

    assert api_path("/jobs/{}/cancel", "a b?c#d%2F&") == "/jobs/a%20b%3Fc%23d%252F%26/cancel"
    assert api_path("/teams/{}/quotas/{}", "t", "a100") == "/teams/t/quotas/a100"
    with pytest.raises(ClientError, match="holds no '/'"):
        api_path("/jobs/{}", "x/y")
