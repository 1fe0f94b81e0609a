"""The engine simulator over real HTTP (`engines/sim/server.py`, `instance.py`): admission,
waiting, prefix cache, faults, kill, metrics, the `gpuplane engine sim` child."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuplane.engines import get_adapter
from gpuplane.engines.sim import SimFleet, sim_process, start_sim

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

SYSTEM = "You are the simulator's system prompt. " * 40  # ~1,600 characters, ~400 tokens


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30.0) as c:
        yield c


def chat(question: str, *, max_tokens: int = 8, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def stream_events(c: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[str]:
    events = []
    async with c.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.aiter_lines():
            if line:
                events.append(line)
    return events


async def until(check: Any, what: str) -> None:
    """Wait for a condition the server reaches asynchronously (a deadline, not a speed claim)."""
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_running_never_exceeds_max_num_seqs_and_the_rest_wait_inside(
    client: httpx.AsyncClient,
) -> None:
    async with start_sim(instances=1, max_num_seqs=3, itl_ms=5.0) as fleet:
        bodies = [chat(f"question {i}", max_tokens=6) for i in range(9)]
        url = fleet.urls[0] + "/v1/chat/completions"
        replies = await asyncio.gather(*(client.post(url, json=b) for b in bodies))
        assert [r.status_code for r in replies] == [200] * 9
        (stats,) = fleet.stats()
        assert stats["max_running_seen"] == 3
        assert stats["max_in_flight_seen"] > 3
        assert stats["requests_waited"] > 0
        assert stats["waiting_time_total_s"] > 0
        assert (stats["requests_total"], stats["requests_completed"]) == (9, 9)
        assert (stats["running"], stats["waiting"]) == (0, 0)


async def test_streaming_speaks_openai_chunks_and_ends_with_done(client: httpx.AsyncClient) -> None:
    async with start_sim(instances=1, max_num_seqs=2, itl_ms=1.0) as fleet:
        body = chat("hello", max_tokens=4, stream=True)
        body["stream_options"] = {"include_usage": True}
        events = await stream_events(client, fleet.urls[0], body)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:5]]
    assert all(isinstance(t, str) and t for t in contents)
    assert chunks[5]["choices"][0]["finish_reason"] == "length"
    assert chunks[6]["choices"] == []
    assert chunks[6]["usage"]["completion_tokens"] == 4


async def test_completions_and_models(client: httpx.AsyncClient) -> None:
    async with start_sim(instances=2, max_num_seqs=[4, 5], model="m") as fleet:
        r = await client.post(
            fleet.urls[1] + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}
        )
        models = (await client.get(fleet.urls[0] + "/v1/models")).json()
        info = (await client.get(fleet.urls[1] + "/server_info")).json()
        model_info = (await client.get(fleet.urls[1] + "/model_info")).json()
        health = await client.get(fleet.urls[0] + "/health")
    out = r.json()
    assert out["object"] == "text_completion"
    assert out["usage"]["completion_tokens"] == 3
    assert models["data"][0]["id"] == "m"
    assert get_adapter("sim").parse_capacity(info) == 5
    assert model_info["is_generation"] is True
    assert health.status_code == 200


async def test_a_shared_prefix_is_served_from_the_instance_cache(client: httpx.AsyncClient) -> None:
    async with start_sim(instances=2, max_num_seqs=2) as fleet:
        a, b = fleet.urls
        first = (await client.post(a + "/v1/chat/completions", json=chat("one"))).json()
        again = (await client.post(a + "/v1/chat/completions", json=chat("two"))).json()
        elsewhere = (await client.post(b + "/v1/chat/completions", json=chat("three"))).json()
        stats = fleet.stats()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    shared = len(f"<|system|>\n{SYSTEM}\n<|user|>\n")  # the text both prompts start with
    assert cached == shared // 64 * 16  # whole 16-token blocks of it, 4 characters a token
    assert (
        elsewhere["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    )  # caches are per instance
    assert stats[0]["prefix_hit_tokens"] == cached
    assert stats[0]["prefill_tokens"] < stats[0]["prompt_tokens"]
    assert stats[1]["prefix_hit_tokens"] == 0


async def test_injected_errors_are_openai_shaped_500s(client: httpx.AsyncClient) -> None:
    async with start_sim(instances=1, max_num_seqs=1, error_rate=1.0) as fleet:
        r = await client.post(fleet.urls[0] + "/v1/chat/completions", json=chat("x"))
        assert r.status_code == 500
        assert "simulated engine failure" in r.json()["error"]["message"]
        assert fleet.stats()[0]["running"] == 0


async def test_a_dropped_stream_ends_after_the_given_token(client: httpx.AsyncClient) -> None:
    async with start_sim(instances=1, max_num_seqs=1, drop_rate=1.0, drop_at_token=2) as fleet:
        events: list[str] = []

        async def read() -> None:
            body = chat("x", max_tokens=10, stream=True)
            async with client.stream(
                "POST", fleet.urls[0] + "/v1/chat/completions", json=body
            ) as r:
                async for line in r.aiter_lines():
                    if line:
                        events.append(line)

        with pytest.raises(httpx.RemoteProtocolError):
            await read()
        assert len(events) == 3  # role chunk + 2 tokens, then the connection is gone
        assert "[DONE]" not in events[-1]
        await until(lambda: fleet.stats()[0]["running"] == 0, "the slot is released")
        assert fleet.stats()[0]["injected_drops"] == 1


async def test_a_drop_at_token_zero_fails_before_the_first_byte(client: httpx.AsyncClient) -> None:
    async with start_sim(instances=1, max_num_seqs=1, drop_rate=1.0, drop_at_token=0) as fleet:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(fleet.urls[0] + "/v1/chat/completions", json=chat("x", stream=True))


async def test_a_hung_request_holds_its_place_until_the_client_leaves(
    client: httpx.AsyncClient,
) -> None:
    async with start_sim(instances=1, max_num_seqs=1, hang_rate=1.0) as fleet:
        url = fleet.urls[0] + "/v1/chat/completions"
        task = asyncio.create_task(client.post(url, json=chat("x")))
        await until(lambda: fleet.stats()[0]["running"] == 1, "the request runs")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: fleet.stats()[0]["running"] == 0, "the place is freed on disconnect")
        assert fleet.stats()[0]["requests_aborted"] == 1


async def test_a_client_that_leaves_while_waiting_leaves_the_engine_queue(
    client: httpx.AsyncClient,
) -> None:
    async with start_sim(instances=1, max_num_seqs=1, hang_rate=0.0, itl_ms=20.0) as fleet:
        url = fleet.urls[0] + "/v1/chat/completions"
        long = asyncio.create_task(client.post(url, json=chat("long", max_tokens=25)))
        await until(lambda: fleet.stats()[0]["running"] == 1, "the first request runs")
        queued = asyncio.create_task(client.post(url, json=chat("queued")))
        await until(lambda: fleet.stats()[0]["waiting"] == 1, "the second request waits")
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        await until(lambda: fleet.stats()[0]["waiting"] == 0, "the waiter left")
        assert (await long).status_code == 200
        stats = fleet.stats()[0]
        assert (stats["requests_completed"], stats["requests_aborted"]) == (1, 1)


async def test_kill_drops_connections_and_restart_serves_again(client: httpx.AsyncClient) -> None:
    async with start_sim(instances=2, max_num_seqs=2, itl_ms=20.0) as fleet:
        url = fleet.urls[0]
        task = asyncio.create_task(
            stream_events(client, url, chat("x", max_tokens=50, stream=True))
        )
        await until(lambda: fleet.stats()[0]["running"] == 1, "the stream runs")
        kill = await client.post(fleet.urls[1] + "/sim/instances/0/kill")
        assert kill.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            await task
        with pytest.raises(httpx.ConnectError):
            await client.get(url + "/health")
        await fleet.restart(0)
        assert (await client.get(url + "/health")).status_code == 200
        r = await client.post(url + "/v1/chat/completions", json=chat("after"))
        assert r.status_code == 200
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # cache lost
        stats = fleet.stats()[0]
        assert stats["kills"] == 1
        assert stats["alive"]
        assert stats["running"] == 0


async def test_a_hung_instance_answers_nothing_until_released(client: httpx.AsyncClient) -> None:
    async with start_sim(instances=1, max_num_seqs=1) as fleet:
        fleet.hang(0)
        with pytest.raises(httpx.ReadTimeout):
            await client.get(fleet.urls[0] + "/health", timeout=0.2)
        fleet.hang(0, False)
        assert (await client.get(fleet.urls[0] + "/health")).status_code == 200


async def test_a_seed_fixes_faults_and_text(client: httpx.AsyncClient) -> None:
    async def run(seed: int) -> list[tuple[int, str]]:
        out = []
        async with start_sim(instances=1, max_num_seqs=4, seed=seed, error_rate=0.5) as fleet:
            for i in range(24):
                r = await client.post(fleet.urls[0] + "/v1/chat/completions", json=chat(f"q{i}"))
                text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
                out.append((r.status_code, text))
        return out

    first = await run(3)
    assert first == await run(3)
    assert first != await run(4)
    assert {code for code, _ in first} == {200, 500}


async def test_metrics_are_vllm_prometheus_text_that_reflects_load(
    client: httpx.AsyncClient,
) -> None:
    async with start_sim(instances=1, max_num_seqs=2, itl_ms=20.0) as fleet:
        url = fleet.urls[0]
        tasks = [
            asyncio.create_task(
                client.post(url + "/v1/chat/completions", json=chat(f"{i}", max_tokens=20))
            )
            for i in range(3)
        ]
        await until(lambda: fleet.stats()[0]["waiting"] == 1, "two run and one waits")
        text = (await client.get(url + "/metrics")).text
        await asyncio.gather(*tasks)
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ):
        assert name in names
    load = get_adapter("sim").parse_load(text)
    assert (load.running, load.waiting) == (2, 1)
    assert load.kv_cache_usage is not None
    assert 0 < load.kv_cache_usage <= 1


async def test_bad_requests_say_what_is_wrong(client: httpx.AsyncClient) -> None:
    async with start_sim(instances=1, max_num_seqs=1) as fleet:
        url = fleet.urls[0]
        bad_json = await client.post(url + "/v1/chat/completions", content=b"{nope")
        no_messages = await client.post(url + "/v1/chat/completions", json={"model": "sim"})
        bad_max = await client.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 0})
        unknown = await client.post(url + "/sim/instances/7/kill")
    assert bad_json.status_code == 400
    assert "not valid JSON" in bad_json.json()["error"]["message"]
    assert "messages" in no_messages.json()["error"]["message"]
    assert "max_tokens" in bad_max.json()["error"]["message"]
    assert unknown.status_code == 404
    assert "0..0" in unknown.json()["error"]["message"]


def test_fleet_needs_an_instance() -> None:
    with pytest.raises(ValueError, match="at least one instance"):
        SimFleet([])


async def test_the_cli_runs_instances_in_a_child_process(client: httpx.AsyncClient) -> None:
    async with sim_process(instances=2, max_num_seqs=[1, 2], itl_ms=1.0, seed=5) as sim:
        r = await client.post(sim.urls[1] + "/v1/chat/completions", json=chat("x"))
        assert r.status_code == 200
        await sim.kill(0)
        with pytest.raises(httpx.ConnectError):
            await client.get(sim.urls[0] + "/health")
        await sim.restart(0)
        assert (await client.get(sim.urls[0] + "/health")).status_code == 200
        stats = await sim.stats()
    assert [s["max_num_seqs"] for s in stats] == [1, 2]
    assert [s["kills"] for s in stats] == [1, 0]
    assert stats[1]["requests_completed"] == 1
    assert sim.proc.returncode is not None  # stopped with the block


@pytest.mark.parametrize("flags", [["-o", "json"], ["--json"]], ids=["-o json", "--json"])
def test_the_sim_command_prints_its_urls_as_one_json_line(flags: list[str]) -> None:
    """`-o json` is the one way, as for every command; `--json` is its deprecated alias."""
    argv = [sys.executable, "-m", "gpuplane.cli.main", "engine", "sim", *flags]
    proc = subprocess.Popen([*argv, "--base-port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        (url,) = json.loads(proc.stdout.readline())["urls"]
        assert url.startswith("http://127.0.0.1:")
    finally:
        proc.terminate()
        proc.wait(30)
