"""`gpuplane simulate`: replay cluster traces through the scheduler core. Thin: parse, call
`gpuplane.control.simulate`, print.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from gpuplane.control.scheduler import DEFAULT_POLICY, policy_class, policy_names
from gpuplane.control.simulate import (
    SeedResult,
    load_nodes,
    load_pods,
    parse_seeds,
    simulate,
)
from gpuplane.errors import GpuplaneError

app = typer.Typer(help="Replay cluster traces through the scheduler core.", no_args_is_help=True)
err = Console(stderr=True)


@app.command()
def openb(
    nodes: Path = typer.Option(
        ..., "--nodes", exists=True, dir_okay=False, help="openb_node_list_gpu_node.csv"
    ),
    pods: Path = typer.Option(
        ..., "--pods", exists=True, dir_okay=False, help="openb_pod_list_*.csv"
    ),
    policy: str = typer.Option(
        DEFAULT_POLICY, "--policy", help=f"one of: {', '.join(policy_names())}"
    ),
    tune: float = typer.Option(
        1.3, "--tune", min=0.01, help="append pods until demand reaches this x GPU capacity"
    ),
    seeds: str = typer.Option("42-51", "--seeds", help="e.g. 42-51 or 42,43"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
) -> None:
    """The FGD paper's packing protocol on the Alibaba openb trace (docs/architecture.md).

    Prints the GPU allocation ratio when the arrived demand reaches 100 % and at the end
    (130 % for --tune 1.3), averaged over the seeds, the failed pods by cause and the run time.
    """
    try:
        policy_class(policy)
        seed_list = parse_seeds(seeds)
        node_list, pod_list = load_nodes(nodes), load_pods(pods)
    except GpuplaneError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None

    def progress(r: SeedResult) -> None:
        if not as_json:
            err.print(
                f"seed {r.seed}: {r.pods} pods, alloc {r.alloc_ratio_100:.2f} % / "
                f"{r.alloc_ratio_final:.2f} %, {r.seconds:.1f} s",
                highlight=False,
            )

    result = simulate(node_list, pod_list, policy, seed_list, tune, progress)
    doc = result.as_dict()
    if as_json:
        typer.echo(json.dumps(doc))
        return
    final = f"alloc_ratio_{round(tune * 100)}"
    t = Table(title=f"openb, policy {policy}, tune {tune}, seeds {seeds}")
    for col in ("alloc_ratio_100 (%)", f"{final} (%)", "failed pods / seed", "run time (s)"):
        t.add_column(col, justify="right")
    failed = sum(result.failures.values())
    t.add_row(
        f"{doc['alloc_ratio_100']:.2f}",
        f"{doc[final]:.2f}",
        f"{failed:.1f}",
        f"{result.seconds:.1f}",
    )
    out = Console(width=None if sys.stdout.isatty() else 160)
    out.print(t)
    causes = ", ".join(f"{k} {v:.1f}" for k, v in result.failures.items()) or "none"
    out.print(f"failures by cause (mean per seed): {causes}", highlight=False)
