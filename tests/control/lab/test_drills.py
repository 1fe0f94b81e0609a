"""The drills' measuring core (`Recovery`, `ClientTally`), and `gpuplane drill` refusing what it
cannot run with what to do; the drills themselves run end to end in tests/e2e/test_drills.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplane.cli import drill as drill_cli
from gpuplane.cli.main import app
from gpuplane.control.client import TOKEN_ENV
from gpuplane.control.lab.drills import ClientTally, DrillResult, Recovery
from gpuplane.serve.errors import sse_error_event
from tests.control.api_server import serving
from tests.control.svc_helpers import admin_token, config, make_service


def steps(r: Recovery) -> tuple[float | None, ...]:
    """Out of rotation, detected, switched, replaced."""
    return (r.out_of_rotation_s, r.detected_s, r.switched_s, r.replaced_s)


def test_a_crash_recovers_once_the_victim_left_and_the_replicas_serve_again() -> None:
    r = Recovery("a", "local", replicas=2, whole_cluster=False)
    assert not r.observe(0.05, {"a": "local", "b": "local"}, detected=False)
    assert not r.observe(0.2, {"b": "local"}, detected=False)
    assert steps(r) == (0.2, None, 0.2, None)
    assert not r.observe(0.4, {"b": "local"}, detected=True)
    assert r.observe(3.0, {"b": "local", "c": "local"}, detected=True)
    assert steps(r) == (0.2, 0.4, 0.2, 3.0)


def test_a_lost_cluster_counts_only_instances_elsewhere() -> None:
    r = Recovery("a", "east", replicas=2, whole_cluster=True)
    # the victim left, but its neighbour on the lost cluster still serves: not switched
    assert not r.observe(0.1, {"b": "east"}, detected=True)
    assert steps(r) == (0.1, 0.1, None, None)
    assert not r.observe(0.2, {}, detected=True)
    assert not r.observe(2.0, {"c": "west", "b": "east"}, detected=True)
    assert steps(r) == (0.1, 0.1, None, None)  # some traffic still goes to the lost cluster
    assert not r.observe(2.5, {"c": "west"}, detected=True)
    assert steps(r) == (0.1, 0.1, 2.5, None)  # one of two replicas
    assert r.observe(3.0, {"c": "west", "d": "west"}, detected=True)
    assert steps(r) == (0.1, 0.1, 2.5, 3.0)


def test_a_tally_tells_whole_answers_from_cut_and_failed_ones() -> None:
    t = ClientTally()
    assert t.count(200, 'data: {"choices": []}\n\ndata: [DONE]\n\n')
    assert not t.count(200, 'data: {"choices": []}\n\ndata: {"error": {"message": "cut"}}\n\n')
    assert not t.count(200, 'data: {"choices": []}\n\n')  # silently cut: no [DONE]
    assert not t.count(503, '{"error": {"message": "no healthy instance"}}')
    assert not t.count(0, "ConnectError: refused")
    assert (t.ok, t.cut, t.failed) == (1, 2, 2)
    assert t.errors == [
        "cut mid-stream: cut",
        "cut mid-stream: the stream ended without [DONE]",
        "HTTP 503: no healthy instance",
        "no answer: ConnectError: refused",
    ]


def test_a_tally_keeps_each_kind_of_failure_once_in_words() -> None:
    t = ClientTally()
    refused = '{"error": {"message": "no healthy instance for model chat", "code": "no_instance"}}'
    for _ in range(3):
        t.count(503, refused)
    long_cut = 'data: {"choices": [{"delta": {"content": "' + "word " * 200 + '"}}]}\n\n'
    t.count(200, long_cut + sse_error_event("the engine failed mid-stream", "upstream").decode())
    t.count(502, "<html>Bad Gateway</html>")
    assert t.errors == [
        "HTTP 503: no healthy instance for model chat (no_instance)",
        "cut mid-stream: the engine failed mid-stream (upstream)",
        "HTTP 502: <html>Bad Gateway</html>",
    ]
    assert t.failed == 4


def test_the_drill_table_reads_the_failures_whole(capsys: pytest.CaptureFixture[str]) -> None:
    result = DrillResult(
        fault="crash",
        deployment="chat",
        instance="chat-1",
        cluster="local",
        node=None,
        recovered=True,
        out_of_rotation_s=0.2,
        detected_s=0.5,
        switched_s=0.6,
        replaced_s=3.0,
        requests=40,
        failed=1,
        cut=1,
        retried=2,
        errors=["cut mid-stream: the engine failed mid-stream (upstream)"],
    )
    drill_cli._table(result)
    out = capsys.readouterr().out
    assert "replaced (all replicas serve)  3.00 s" in out
    assert "  cut mid-stream: the engine failed mid-stream (upstream)\n" in out
    assert "{" not in out


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    service = make_service(config(str(tmp_path)))
    monkeypatch.setenv(TOKEN_ENV, admin_token(service))
    try:
        with serving(service) as url:
            yield url
    finally:
        service.close()


def test_the_drill_cli_says_what_is_wrong(control: str) -> None:
    args = ["--server", control, "--gateway", "http://127.0.0.1:9"]
    result = CliRunner().invoke(app, ["drill", "crash", "chta", *args])
    assert result.exit_code == 1
    assert "unknown deployment 'chta'" in result.output
    no_control = CliRunner().invoke(
        app, ["drill", "node", "chat", "--server", "http://127.0.0.1:9"]
    )
    assert no_control.exit_code == 1
    assert "cannot reach the control plane" in no_control.output
    unknown = CliRunner().invoke(app, ["drill", "disk", "chat"])
    assert unknown.exit_code == 2
    assert "'disk' is not one of" in unknown.output
