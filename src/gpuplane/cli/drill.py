"""`gpuplane drill crash|node|cluster DEPLOYMENT`: a self-healing drill against a running control
plane and gateway, under streaming load; prints how long each recovery step took and what the
clients saw (`control/deployments/drills.py`)."""

from __future__ import annotations

from typing import Any

import typer

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    console,
    emit,
    fail,
    print_table,
)
from gpuplane.cli._loop import run
from gpuplane.cli.serve import ADMIN_KEY_OPTION
from gpuplane.cli.serve import SERVER_OPTION as GATEWAY_OPTION
from gpuplane.control.deployments.drills import DrillError, DrillResult, run_drill

app = typer.Typer(
    help="Self-healing drills: inject a fault into a deployment under load and time the recovery.",
    no_args_is_help=True,
)

NAME = typer.Argument(..., help="deployment name")
CLIENTS = typer.Option(4, min=1, max=256, help="concurrent streaming clients of the load")
MAX_TOKENS = typer.Option(32, min=1, help="max_tokens of each request of the load")
TIMEOUT = typer.Option(120.0, min=1, help="give up on a recovery step after this many seconds")
API_KEY = typer.Option(
    None, "--api-key", envvar="GPUPLANE_API_KEY", help="a tenant key, for a gateway with keys"
)
LOST_FOR = typer.Option(
    60.0, min=1, max=3600, help="how long the lost node or cluster answers nothing"
)


def _drill(fault: str, deployment: str, opts: dict[str, Any], output: Output) -> None:
    try:
        result = run(run_drill(fault, deployment, **opts))
    except DrillError as exc:
        fail(str(exc))
    emit(result.to_json(), output, lambda _: _table(result))
    if not result.recovered:
        raise typer.Exit(1)


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f} s"


def _table(r: DrillResult) -> None:
    where = f"{r.cluster}/{r.node}" if r.node else r.cluster
    console.print(
        f"drill {r.fault} on {r.deployment}: instance {r.instance} on {where}", highlight=False
    )
    steps = [
        ("out of rotation (gateway)", _seconds(r.out_of_rotation_s)),
        ("detected (control plane)", _seconds(r.detected_s)),
        ("traffic on survivors only", _seconds(r.switched_s)),
        ("replaced (all replicas serve)", _seconds(r.replaced_s)),
        ("replaced after detection", _seconds(r.replaced_after_detection_s)),
    ]
    print_table(["step", "after the fault"], steps)
    console.print(
        f"requests: {r.requests}, failed {r.failed}, cut by an error event {r.cut}, "
        f"retried by the gateway {r.retried}",
        highlight=False,
    )
    for error in r.errors:
        console.print(f"  {error}", highlight=False, markup=False)
    if not r.recovered:
        console.print("[red]not recovered within the drill's timeout[/red]")


def _options(
    server: str | None,
    token: str | None,
    gateway: str,
    admin_key: str | None,
    api_key: str | None,
    clients: int,
    max_tokens: int,
    timeout_s: float,
) -> dict[str, Any]:
    return {
        "control": server,
        "control_token": token,
        "gateway": gateway,
        "admin_key": admin_key,
        "api_key": api_key,
        "clients": clients,
        "max_tokens": max_tokens,
        "timeout_s": timeout_s,
    }


@app.command()
def crash(
    deployment: str = NAME,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    gateway: str = GATEWAY_OPTION,
    admin_key: str | None = ADMIN_KEY_OPTION,
    api_key: str | None = API_KEY,
    clients: int = CLIENTS,
    max_tokens: int = MAX_TOKENS,
    timeout_s: float = TIMEOUT,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Kill one instance's engine (SIGKILL); the gateway takes it out of rotation, the
    controller starts a replacement after its back-off."""
    opts = _options(server, token, gateway, admin_key, api_key, clients, max_tokens, timeout_s)
    _drill("crash", deployment, opts, output)


@app.command()
def node(
    deployment: str = NAME,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    gateway: str = GATEWAY_OPTION,
    admin_key: str | None = ADMIN_KEY_OPTION,
    api_key: str | None = API_KEY,
    clients: int = CLIENTS,
    max_tokens: int = MAX_TOKENS,
    timeout_s: float = TIMEOUT,
    lost_for_s: float = LOST_FOR,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Lose the node of one instance (a local cluster is one machine: its whole cluster);
    its instances are replaced elsewhere."""
    opts = _options(server, token, gateway, admin_key, api_key, clients, max_tokens, timeout_s)
    _drill("node", deployment, {**opts, "lost_for_s": lost_for_s}, output)


@app.command()
def cluster(
    deployment: str = NAME,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    gateway: str = GATEWAY_OPTION,
    admin_key: str | None = ADMIN_KEY_OPTION,
    api_key: str | None = API_KEY,
    clients: int = CLIENTS,
    max_tokens: int = MAX_TOKENS,
    timeout_s: float = TIMEOUT,
    lost_for_s: float = LOST_FOR,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Lose the cluster of one instance; traffic moves to the surviving cluster and the lost
    capacity is placed there, within the team's quota."""
    opts = _options(server, token, gateway, admin_key, api_key, clients, max_tokens, timeout_s)
    _drill("cluster", deployment, {**opts, "lost_for_s": lost_for_s}, output)
