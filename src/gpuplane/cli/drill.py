"""`gpuplane drill crash|node|cluster DEPLOYMENT`: a self-healing drill against a running control
plane and gateway, under streaming load; prints how long each recovery step took and what the
clients saw (`control/lab/drills.py`)."""

from __future__ import annotations

from enum import StrEnum
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
from gpuplane.cli._secrets import secret_option
from gpuplane.cli.serve import ADMIN_KEY_OPTION
from gpuplane.cli.serve import SERVER_OPTION as GATEWAY_OPTION
from gpuplane.control.client import ClientError
from gpuplane.control.lab.drills import DrillError, DrillResult, run_drill

NAME = typer.Argument(..., help="deployment name")
CLIENTS = typer.Option(4, min=1, max=256, help="concurrent streaming clients of the load")
MAX_TOKENS = typer.Option(32, min=1, help="max_tokens of each request of the load")
TIMEOUT = typer.Option(120.0, min=1, help="give up on a recovery step after this many seconds")
API_KEY = secret_option("--api-key", "GPUPLANE_API_KEY", "a tenant key, for a gateway with keys")
LOST_FOR = typer.Option(
    60.0, min=1, max=3600, help="node, cluster: how long the lost one answers nothing"
)


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
    if r.errors:
        console.print("what failed clients saw (first kinds):", highlight=False)
    for error in r.errors:
        console.print(f"  {error}", highlight=False, markup=False)
    if not r.recovered:
        console.print("[red]not recovered within the drill's timeout[/red]")


class DrillFault(StrEnum):
    """What a drill breaks."""

    crash = "crash"
    node = "node"
    cluster = "cluster"


FAULT = typer.Argument(
    ...,
    help="crash: SIGKILL one instance's engine (the gateway takes it out of rotation, the "
    "controller restarts it after its back-off); node: lose the node of one instance (a local "
    "cluster is one machine: its whole cluster), its instances are replaced elsewhere; "
    "cluster: lose the cluster of one instance, traffic moves to the surviving cluster and the "
    "lost capacity is placed there, within the team's quota",
)


def drill(
    fault: DrillFault = FAULT,
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
    """Time a self-healing drill on a deployment. Injects FAULT into DEPLOYMENT under streaming load
    through the gateway and times each recovery step."""
    opts: dict[str, Any] = {
        "control": server,
        "control_token": token,
        "gateway": gateway,
        "admin_key": admin_key,
        "api_key": api_key,
        "clients": clients,
        "max_tokens": max_tokens,
        "timeout_s": timeout_s,
    }
    if fault is not DrillFault.crash:
        opts["lost_for_s"] = lost_for_s
    try:
        result = run(run_drill(fault.value, deployment, **opts))
    except (DrillError, ClientError) as exc:  # ClientError: a deployment name no path can hold
        fail(str(exc))
    emit(result.to_json(), output, lambda _: _table(result))
    if not result.recovered:
        raise typer.Exit(1)
