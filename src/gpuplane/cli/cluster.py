"""`gpuplane cluster add | list | describe | cordon | uncordon | drain | remove`: the clusters of
the pool, their inventory, health and lifecycle."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    client,
    complete_clusters,
    console,
    emit,
    fail,
    mib,
    print_fields,
    print_table,
    relative,
    show,
)
from gpuplane.control.settings import ADAPTER_KINDS, ClusterConfig
from gpuplane.errors import explain

app = typer.Typer(help="Clusters in the pool.", no_args_is_help=True)

CLUSTER = typer.Argument(..., autocompletion=complete_clusters)


def _state(x: dict[str, Any]) -> str:
    """One word for a table: unreachable, draining, cordoned or ready."""
    if x["health"] != "ok":
        return str(x["health"])
    return "draining" if x["draining"] else "cordoned" if x["cordoned"] else "ready"


@app.command()
def add(
    name: str = typer.Argument(..., help="cluster name (lowercase letters, digits, '-')"),
    adapter: str = typer.Option(..., "--adapter", help=f"cluster kind: {', '.join(ADAPTER_KINDS)}"),
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", help="kubernetes: kubeconfig file (its path is stored, not its keys)"
    ),
    context: str | None = typer.Option(None, "--context", help="kubernetes: kubeconfig context"),
    address: str | None = typer.Option(
        None, "--address", help="ray: URL of its dashboard's job API (http://host:8265)"
    ),
    token_file: Path | None = typer.Option(
        None, "--token-file", help="ray: file holding its auth token (its path is stored)"
    ),
    region: str | None = typer.Option(None, "--region", help="the gpuplane.io/region label"),
    label: list[str] = typer.Option([], "--label", "-l", help="KEY=VALUE on every node"),
    namespace: str | None = typer.Option(
        None, "--namespace", help="kubernetes: namespace of a team's Pods ({team})"
    ),
    sync_interval: float | None = typer.Option(
        None, "--sync-interval", help="seconds without an answer before it is unreachable"
    ),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Add a cluster to the pool (stored: it stays across restarts). Its backend must answer, on
    a supported version; credentials stay in the kubeconfig, which is referenced, not copied."""
    body: dict[str, Any] = {"name": name, "adapter": adapter}
    labels = dict(_pair(x) for x in label)
    for key, value in (
        ("kubeconfig", str(kubeconfig.resolve()) if kubeconfig else None),  # the server reads it
        ("context", context),
        ("address", address),
        ("token_file", str(token_file.resolve()) if token_file else None),
        ("region", region),
        ("labels", labels or None),
        ("namespace", namespace),
        ("sync_interval_s", sync_interval),
    ):
        if value is not None:
            body[key] = value
    try:  # refused here, before any I/O, with the option to fix
        ClusterConfig.model_validate(body)
    except ValidationError as exc:
        fail("; ".join(_option_error(e) for e in exc.errors()))
    with client(server, token, options=True) as c:
        cluster = c.add_cluster(body)
    emit(cluster, output, _describe)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        fail(f"--label {text!r}: give KEY=VALUE, e.g. --label gpuplane.io/zone=a")
    return key, value


def _option_error(error: Any) -> str:
    message = explain(error, ClusterConfig, noun="setting", whole="cluster")
    field = str(error["loc"][0]) if error["loc"] else ""
    option = "--" + field.removesuffix("_s").replace("_", "-")
    return message.replace(f"{field}: ", f"{option}: ", 1) if field else message


@app.command("list")
def list_(
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """List clusters with their health, GPUs and what is free."""

    def table(data: list[dict[str, Any]]) -> None:
        now = time.time()
        columns = ["NAME", "ADAPTER", "VERSION", "REGION", "STATE", "NODES", "GPUS", "FREE"]
        columns += ["FREE MILLI", "SLICES", "JOBS", "SYNCED"]
        print_table(
            columns,
            [
                [
                    x["name"],
                    x["adapter"],
                    x["version"] or "-",
                    x["labels"].get("gpuplane.io/region", ""),
                    _state(x),
                    x["nodes"],
                    x["gpus"],
                    x["gpus_free"],
                    x["gpu_milli_free"],
                    x["slices_used"],
                    x["running_jobs"],
                    relative(x["last_sync_at"], now),
                ]
                for x in data
            ],
            drop=("SYNCED", "REGION", "VERSION", "SLICES", "FREE MILLI", "ADAPTER", "NODES"),
        )

    show(server, token, output, lambda c: c.clusters(), table)


@app.command()
def describe(
    name: str = CLUSTER,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show a cluster, its nodes and their cards. Adapter, version, health, last sync, cordon and
    drain, its stored settings, and each node's cards with their free memory and compute."""
    show(server, token, output, lambda c: c.cluster(name), _describe)


def _describe(x: dict[str, Any]) -> None:
    now = time.time()
    health = x["health"]
    if x["health_reason"]:
        health += f" since {relative(x['unreachable_at'], now)}: {x['health_reason']}"
    rows = [
        ("adapter", x["adapter"]),
        ("version", x["version"] or "-"),
        ("source", "gpuplane.yaml" if x["source"] == "config" else "added (stored)"),
        ("health", health),
        ("state", "draining" if x["draining"] else "cordoned" if x["cordoned"] else "open"),
        ("last sync", relative(x["last_sync_at"], now)),
        ("inventory", x["inventory"]),
        ("gpus", f"{x['gpus']} ({x['gpus_free']} wholly free)"),
        ("slices", f"{x['slices_used']} held, {x['gpu_milli_used']} milli-GPUs"),
        ("jobs", x["running_jobs"]),
        ("labels", ", ".join(f"{k}={v}" for k, v in x["labels"].items())),
    ]
    rows += [(k, v) for k, v in x.get("settings", {}).items() if k not in ("name", "adapter")]
    console.print(f"[bold]{x['name']}[/bold]", highlight=False)
    print_fields(rows, 10)
    table = []
    for node in x["node_list"]:
        for d in node["devices"] or [{}]:
            table.append(
                [
                    node["name"],
                    d.get("index", "-"),
                    d.get("model", "-"),
                    mib(d.get("mem_mib")),
                    mib(d.get("mem_free_mib")),
                    d.get("gpu_milli_free", "-"),
                    f"{node['cpu_free_millis']}/{node['cpu_millis']}",
                ]
            )
    print_table(["NODE", "GPU", "MODEL", "MEM", "MEM FREE", "MILLI FREE", "CPU FREE"], table)


@app.command()
def cordon(
    name: str = CLUSTER, server: str | None = SERVER_OPTION, token: str | None = TOKEN_OPTION
) -> None:
    """Place nothing new on a cluster; what runs there stays."""
    with client(server, token) as c:
        c.cluster_action(name, "cordon")
    console.print(f"cluster {name} cordoned: nothing new is placed there", highlight=False)


@app.command()
def uncordon(
    name: str = CLUSTER, server: str | None = SERVER_OPTION, token: str | None = TOKEN_OPTION
) -> None:
    """Place work on a cluster again (ends a cordon or a drain)."""
    with client(server, token) as c:
        c.cluster_action(name, "uncordon")
    console.print(f"cluster {name} uncordoned: work is placed there again", highlight=False)


@app.command()
def drain(
    name: str = CLUSTER,
    requeue: bool = typer.Option(
        False, "--requeue", help="stop its running jobs now and requeue them elsewhere"
    ),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Cordon a cluster and move its waiting binds elsewhere. Its running jobs finish there
    (`--requeue`: they are preempted and requeued). Then `cluster remove` it."""

    def table(d: dict[str, Any]) -> None:
        left = f"{len(d['running'])} running job(s) left to finish" if d["running"] else "empty"
        console.print(
            f"cluster {name} draining: {len(d['requeued'])} job(s) requeued, {left}",
            highlight=False,
        )

    show(
        server,
        token,
        output,
        lambda c: c.cluster_action(name, "drain", requeue=str(requeue).lower()),
        table,
    )


@app.command()
def remove(
    name: str = CLUSTER, server: str | None = SERVER_OPTION, token: str | None = TOKEN_OPTION
) -> None:
    """Remove a cluster added with `cluster add`. Refused while it holds jobs: drain it."""
    with client(server, token) as c:
        c.remove_cluster(name)
    console.print(f"cluster {name} removed", highlight=False)
