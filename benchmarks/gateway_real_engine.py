"""Slots and prefix affinity in front of real llama.cpp engines, side by side in one run.

Two llama.cpp instances (capacity 1 each, RAM prompt cache on); 4 tenants, each with its own
~800-token system prompt; N requests at client concurrency 4. Contenders, each on freshly
started engines (cold caches) and the same request sequence:

  round_robin   clients send straight to the instances in turn (what a QPS balancer does)
  slots         the gateway: concurrency slots, fair queue, prefix affinity off
  slots_prefix  the gateway: concurrency slots, fair queue, prefix affinity on

A request counts as an error unless it streams to a finish_reason and [DONE].

    .venv/bin/python benchmarks/gateway_real_engine.py [--requests 64] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from _results import save
from gpuplane.config import parse_settings
from gpuplane.engines.config import EngineConfig
from gpuplane.engines.llamacpp import LlamaCpp, cached_prefix_chars, embedded_launches
from gpuplane.serve.server import serving
from gpuplane.serve.supervisor import Supervisor

Request = tuple[int, dict[str, Any]]  # (tenant, chat body)
RESULTS = Path(__file__).parent / "results" / "gateway_real_engine.json"
ENGINE = EngineConfig()  # the embedded defaults: n_ctx 2048, 1 thread, 128 MiB prompt cache
TOPICS = ["billing", "storage", "networking", "scheduling"]


def system_prompt(tenant: int, sentences: int) -> str:
    topic = TOPICS[tenant % len(TOPICS)]
    rules = " ".join(
        f"Rule {i} of the {topic} desk: when asked about case {i * 13 + tenant}, answer in one "
        f"short sentence and mention {topic}."
        for i in range(sentences)
    )
    return f"You are the {topic} assistant of tenant {tenant}. {rules}"


def api_key(tenant: int) -> str:
    return f"key-of-tenant-{tenant}"


async def one_request(
    client: httpx.AsyncClient, url: str, request: Request
) -> tuple[bool, float | None]:
    """(completed, time to first token) of one streamed chat request."""
    tenant, body = request
    headers = {"Authorization": f"Bearer {api_key(tenant)}"}
    start = time.perf_counter()
    ttft = None
    finish = done = False
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                return False, None
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if "error" in event:
                        return False, ttft
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    finish = finish or any(c.get("finish_reason") for c in event["choices"])
    except httpx.HTTPError:
        return False, ttft
    return finish and done, ttft


async def run_contender(
    name: str, urls: list[str], requests: list[Request], concurrency: int, tenants: int
) -> dict[str, Any]:
    """Send the requests with `concurrency` clients; return errors, TTFT and total time."""
    if name == "round_robin":
        targets = [urls[i % len(urls)] + "/v1/chat/completions" for i in range(len(requests))]
        return await drive(targets, requests, concurrency)
    instances = [{"url": u, "max_concurrency": 1} for u in urls]
    settings = parse_settings(
        {
            "gateway": {"port": 0, "placement": {"policy": name}, "queue": {"timeout_s": 600}},
            "tenants": [{"name": f"tenant-{t}", "api_keys": [api_key(t)]} for t in range(tenants)],
            "models": [
                {
                    "name": "smollm2",
                    "engine": "llamacpp",
                    "instances": instances,
                    "cached_prefix_chars": cached_prefix_chars(ENGINE),
                }
            ],
        }
    )
    async with serving(settings) as base:
        return await drive([base + "/v1/chat/completions"] * len(requests), requests, concurrency)


async def drive(targets: list[str], requests: list[Request], concurrency: int) -> dict[str, Any]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)
    outcomes: list[tuple[bool, float | None]] = [(False, None)] * len(requests)

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            outcomes[i] = await one_request(client, targets[i], requests[i])

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=900) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    total = time.perf_counter() - start
    ttfts = sorted(t for ok, t in outcomes if ok and t is not None)
    return {
        "errors": sum(not ok for ok, _ in outcomes),
        "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
        "ttft_p95_s": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 3)
        if ttfts
        else None,
        "total_s": round(total, 1),
    }


async def fresh_engines(ports: list[int], log_dir: Path) -> Supervisor:
    supervisor = Supervisor(LlamaCpp(), embedded_launches(ENGINE, ports), log_dir=log_dir)
    await supervisor.start()
    return supervisor


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    prompts = [system_prompt(t, args.sentences) for t in range(args.tenants)]
    requests = []
    for i in range(args.requests):
        tenant = rng.randrange(args.tenants)
        messages = [
            {"role": "system", "content": prompts[tenant]},
            {"role": "user", "content": f"Question {i}: what is case {rng.randrange(1000)}?"},
        ]
        requests.append(
            (tenant, {"model": "smollm2", "messages": messages, "max_tokens": args.max_tokens,
                      "temperature": 0, "stream": True})
        )  # fmt: skip
    ports = [args.base_port, args.base_port + 1]
    log_dir = Path(".gpuplane/bench-logs")
    results: dict[str, Any] = {}
    for name in ("round_robin", "slots", "slots_prefix"):
        supervisor = await fresh_engines(ports, log_dir)
        try:
            if not results:
                async with httpx.AsyncClient() as c:
                    tokens = await c.post(
                        ports_url(ports[0]) + "/extras/tokenize", json={"input": prompts[0]}
                    )
                results["_setup"] = {
                    "system_prompt_tokens": len(tokens.json()["tokens"]),
                    "requests": args.requests,
                    "tenants": args.tenants,
                    "concurrency": args.concurrency,
                    "instances": len(ports),
                    "max_tokens": args.max_tokens,
                }
            print(f"running {name} ...", file=sys.stderr)
            results[name] = await run_contender(
                name, [ports_url(p) for p in ports], requests, args.concurrency, args.tenants
            )
            print(f"  {name}: {results[name]}", file=sys.stderr)
        finally:
            await supervisor.stop()
    b, c = results["slots"]["ttft_p50_s"], results["slots_prefix"]["ttft_p50_s"]
    results["ratios"] = {"slots_prefix_ttft_p50_over_slots": round(c / b, 3) if b and c else None}
    return results


def ports_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def table(results: dict[str, Any]) -> str:
    rows = ["contender      errors  ttft_p50_s  ttft_p95_s  total_s"]
    for name in ("round_robin", "slots", "slots_prefix"):
        r = results[name]
        rows.append(
            f"{name:<14} {r['errors']:>6}  {r['ttft_p50_s']!s:>10}  {r['ttft_p95_s']!s:>10}"
            f"  {r['total_s']:>7}"
        )
    rows.append(
        f"slots_prefix / slots TTFT p50: {results['ratios']['slots_prefix_ttft_p50_over_slots']}"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=36, help="system prompt length")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--base-port", type=int, default=8131)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    out = asyncio.run(main(args))
    save(out, RESULTS)
    print(json.dumps(out) if args.json else table(out))
