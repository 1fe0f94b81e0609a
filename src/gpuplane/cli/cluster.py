"""`gpuplane cluster list | describe`: the registered clusters, their nodes and cards."""

from __future__ import annotations

from typing import Any

import typer

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    client,
    complete_clusters,
    console,
    emit,
    mib,
    print_table,
)

app = typer.Typer(help="Clusters in the pool.", no_args_is_help=True)


@app.command("list")
def list_(
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """List clusters with their GPUs and what is free."""
    with client(server, token) as c:
        clusters = c.clusters()

    def table(data: list[dict[str, Any]]) -> None:
        print_table(
            ["NAME", "ADAPTER", "REGION", "NODES", "GPUS", "FREE", "FREE MILLI", "JOBS"],
            [
                [
                    x["name"],
                    x["adapter"],
                    x["labels"].get("gpuplane.io/region", ""),
                    x["nodes"],
                    x["gpus"],
                    x["gpus_free"],
                    x["gpu_milli_free"],
                    x["running_jobs"],
                ]
                for x in data
            ],
        )

    emit(clusters, output, table)


@app.command()
def describe(
    name: str = typer.Argument(..., autocompletion=complete_clusters),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show a cluster's labels, inventory source, nodes and each card's free memory and compute."""
    with client(server, token) as c:
        cluster = c.cluster(name)

    def table(x: dict[str, Any]) -> None:
        console.print(
            f"[bold]{x['name']}[/bold] ({x['adapter']}): {x['inventory']}", highlight=False
        )
        console.print(
            "labels: " + ", ".join(f"{k}={v}" for k, v in x["labels"].items()), highlight=False
        )
        rows = []
        for node in x["node_list"]:
            for d in node["devices"] or [{}]:
                rows.append(
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
        print_table(["NODE", "GPU", "MODEL", "MEM", "MEM FREE", "MILLI FREE", "CPU FREE"], rows)

    emit(cluster, output, table)
