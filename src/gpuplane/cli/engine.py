"""`gpuplane engine`: run engines by hand: the simulator (`gpuplane engine sim`) and the
embedded engine's one-token check (`gpuplane engine smoke`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
from pathlib import Path

import typer
import yaml

from gpuplane.cli import _loop
from gpuplane.cli._control_common import Output
from gpuplane.engines.diagnose import classify_exit, tail_of
from gpuplane.engines.llamacpp import (
    SMOKE_CHILD,
    check_installed,
    default_model_path,
    smoke_argv,
)
from gpuplane.engines.sim import SimFleet, fleet_params
from gpuplane.errors import EngineError

app = typer.Typer(name="engine", help="Run inference engines by hand.", no_args_is_help=True)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{what} takes integers separated by commas, got '{text}'"
        ) from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{what} values must be >= 1, got '{text}'")
    return values


def _slowdowns(items: list[str]) -> dict[int, float]:
    out: dict[int, float] = {}
    for item in items:
        index, _, factor = item.partition("=")
        try:
            out[int(index)] = float(factor)
        except ValueError:
            raise typer.BadParameter(
                f"--slow takes INDEX=FACTOR (e.g. 0=3), got '{item}'"
            ) from None
    return out


@app.command()
def sim(
    base_port: int = typer.Option(8200, help="instance i listens on BASE_PORT+i; 0: free ports"),
    instances: int = typer.Option(1, min=1, help="how many instances this process hosts"),
    max_num_seqs: str = typer.Option(
        "4", help="sequences an instance runs at once; a comma list cycles (e.g. 4,5)"
    ),
    seed: int = typer.Option(0, help="seeds failure injection and generated text"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    model: str = typer.Option("sim", help="model name in /v1/models and responses"),
    prefill_tokens_per_s: float = typer.Option(50_000.0, help="prefill speed"),
    itl_ms: float = typer.Option(10.0, help="inter-token latency with one sequence running"),
    itl_growth: float = typer.Option(0.05, help="ITL grows by this share per extra sequence"),
    prefix_cache_tokens: int = typer.Option(262_144, help="LRU prefix cache size; 0: none"),
    block_tokens: int = typer.Option(16, help="prefix cache block size in tokens"),
    default_max_tokens: int = typer.Option(16, help="output tokens when a request sets none"),
    tokens_per_chunk: int = typer.Option(1, help="tokens per streamed SSE chunk"),
    zero_delay: bool = typer.Option(False, help="no prefill or ITL: measure HTTP overhead only"),
    error_rate: float = typer.Option(0.0, help="share of requests answered with HTTP 500"),
    hang_rate: float = typer.Option(0.0, help="share of requests that never answer"),
    drop_rate: float = typer.Option(0.0, help="share of requests whose connection is dropped"),
    drop_at_token: int = typer.Option(1, help="dropped requests lose the connection here"),
    slow: list[str] = typer.Option([], help="INDEX=FACTOR: instance INDEX is FACTOR times slower"),
    output: Output = typer.Option(
        Output.table, "--output", "-o", help="when ready: json (one line: the URLs) or table"
    ),
    json_ready: bool = typer.Option(False, "--json", hidden=True, help="deprecated: -o json"),
    start_delay_s: float = typer.Option(
        0.0, min=0.0, help="wait this long before listening, as an engine loads its model"
    ),
) -> None:
    """Run K simulated OpenAI-compatible engines. In one process (see docs)."""
    try:
        params = fleet_params(
            instances,
            _ints(max_num_seqs, "--max-num-seqs"),
            _slowdowns(slow),
            prefill_tokens_per_s=prefill_tokens_per_s,
            itl_ms=itl_ms,
            itl_growth=itl_growth,
            prefix_cache_tokens=prefix_cache_tokens,
            block_tokens=block_tokens,
            default_max_tokens=default_max_tokens,
            tokens_per_chunk=tokens_per_chunk,
            zero_delay=zero_delay,
            error_rate=error_rate,
            hang_rate=hang_rate,
            drop_rate=drop_rate,
            drop_at_token=drop_at_token,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    fleet = SimFleet(params, seed=seed, host=host, base_port=base_port, model=model)
    try:
        _loop.run(_serve(fleet, Output.json if json_ready else output, start_delay_s))
    except OSError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def smoke(
    model_path: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="GGUF file; default: the embedded SmolLM2-135M"
    ),
    timeout_s: float = typer.Option(300.0, min=1, help="longest wait for the token"),
    child_code: str = typer.Option(
        SMOKE_CHILD, hidden=True, help="what the child runs with the model's path (tests)"
    ),
) -> None:
    """Check that the embedded engine generates a token. Loads the model with llama.cpp in a child
    process and generates one token; on a crash, says why and what to do (exit 1)."""
    try:
        if child_code == SMOKE_CHILD:
            check_installed()
        path = str(model_path) if model_path else default_model_path()
    except EngineError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        done = subprocess.run(
            smoke_argv(path, child_code),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        typer.echo(
            f"error: the engine generated no token within {timeout_s:g} s on {path}; "
            "raise --timeout-s on a slow machine",
            err=True,
        )
        raise typer.Exit(1) from None
    if done.returncode:
        diagnosis = classify_exit(done.returncode, tail_of(done.stdout + "\n" + done.stderr))
        typer.echo(f"error: the engine's smoke inference {diagnosis.explain()}", err=True)
        raise typer.Exit(1)
    answer = tail_of(done.stdout, 1)
    typer.echo(f"smoke inference ok: {Path(path).name} generated {answer[0] if answer else '?'}")


async def _serve(fleet: SimFleet, output: Output, start_delay_s: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):  # a stop while "loading" ends it at once
        await asyncio.wait_for(stop.wait(), start_delay_s)
    if stop.is_set():
        return
    await fleet.start()
    if output in (Output.json, Output.yaml):  # one line, which a parent reads to go on
        ready = {"urls": fleet.urls}
        flow = yaml.safe_dump(ready, default_flow_style=True, width=2**31).strip()
        typer.echo(json.dumps(ready) if output == Output.json else flow)
    else:
        for inst in fleet.instances:
            cap = inst.core.params.max_num_seqs
            typer.echo(f"sim instance {inst.index}: {inst.url} (max_num_seqs {cap})")
        typer.echo("stats: GET /sim/stats on any instance; Ctrl-C stops")
    try:
        await stop.wait()
    finally:
        await fleet.stop()
