"""`gpuplane simulate`: replay cluster traces through the scheduler core. Thin: parse, call
`gpuplane.control.lab.simulate`, print.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuplane.cli._control_common import OUTPUT_OPTION, Output, console, emit
from gpuplane.control.lab.simulate import (
    SeedResult,
    SimulationResult,
    load_nodes,
    load_pods,
    parse_seeds,
    simulate,
)
from gpuplane.control.scheduler import DEFAULT_POLICY, policy_class, policy_names
from gpuplane.errors import GpuplaneError

app = typer.Typer(help="Replay cluster traces through the scheduler core.", no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True)  # a URL in a message stays whole

DATA_ENV = "GPUPLANE_OPENB"
NODES_CSV, PODS_CSV = "openb_node_list_gpu_node.csv", "openb_pod_list_default.csv"
# where a clone keeps the trace, then where this project's checkouts find it (beside the clone)
DATA_DIRS = (Path("data/openb"), Path("../shared/data/openb"))
TRACE_URL = (
    "https://raw.githubusercontent.com/alibaba/clusterdata/master/cluster-trace-gpu-v2023/csv"
)


def trace_files(data: Path | None, nodes: Path | None, pods: Path | None) -> tuple[Path, Path]:
    """The node and pod CSVs: `--nodes`/`--pods` when given, else the two files in `data`
    (`--data`, $GPUPLANE_OPENB), else in the first of DATA_DIRS that holds them. A missing file
    is a GpuplaneError that says how to fetch the trace."""
    folders = [data] if data is not None else [d for d in DATA_DIRS if (d / NODES_CSV).is_file()]
    folder = folders[0] if folders else DATA_DIRS[0]
    chosen = (nodes or folder / NODES_CSV, pods or folder / PODS_CSV)
    missing = [p for p in chosen if not p.is_file()]
    if missing:
        target = missing[0].parent
        fetch = "; ".join(
            f"curl -fL --create-dirs -o {target / name} {TRACE_URL}/{name}"
            for name in (NODES_CSV, PODS_CSV)
        )
        raise GpuplaneError(
            f"{', '.join(map(str, missing))}: no such file. The Alibaba openb trace "
            f"(cluster-trace-gpu-v2023) is not part of a clone; fetch it with: {fetch}; "
            f"or name its folder with --data DIR (${DATA_ENV})"
        )
    return chosen


@app.command()
def openb(
    data: Path | None = typer.Option(
        None,
        "--data",
        envvar=DATA_ENV,
        file_okay=False,
        help=f"folder of the trace's CSVs; default: the first of "
        f"{', '.join(map(str, DATA_DIRS))} that holds them",
        show_default=False,
    ),
    nodes: Path | None = typer.Option(
        None, "--nodes", dir_okay=False, help=f"node list (default: DATA/{NODES_CSV})"
    ),
    pods: Path | None = typer.Option(
        None, "--pods", dir_okay=False, help=f"pod list (default: DATA/{PODS_CSV})"
    ),
    policy: str = typer.Option(
        DEFAULT_POLICY, "--policy", help=f"one of: {', '.join(policy_names())}"
    ),
    tune: float = typer.Option(
        1.3, "--tune", min=0.01, help="append pods until demand reaches this x GPU capacity"
    ),
    seeds: str = typer.Option("42-51", "--seeds", help="e.g. 42-51 or 42,43"),
    output: Output = OUTPUT_OPTION,
    as_json: bool = typer.Option(False, "--json", hidden=True, help="deprecated: -o json"),
) -> None:
    """Replay the Alibaba openb trace through the scheduler. With the FGD paper's packing
    protocol (docs/architecture.md).

    Prints the GPU allocation ratio when the arrived demand reaches 100 % and at the end
    (130 % for --tune 1.3), averaged over the seeds, the failed pods by cause and the run time.
    The trace is not part of a clone: see docs/cli.md for where it comes from.
    """
    if as_json:
        err.print("note: --json is deprecated; use -o json", highlight=False)
        output = Output.json
    try:
        policy_class(policy)
        seed_list = parse_seeds(seeds)
        nodes_csv, pods_csv = trace_files(data, nodes, pods)
        node_list, pod_list = load_nodes(nodes_csv), load_pods(pods_csv)
    except GpuplaneError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    quiet = output in (Output.json, Output.yaml)

    def progress(r: SeedResult) -> None:
        if not quiet:
            err.print(
                f"seed {r.seed}: {r.pods} pods, alloc {r.alloc_ratio_100:.2f} % / "
                f"{r.alloc_ratio_final:.2f} %, {r.seconds:.1f} s",
                highlight=False,
            )

    result = simulate(node_list, pod_list, policy, seed_list, tune, progress)
    emit(result.as_dict(), output, lambda doc: _table(doc, result, policy, tune, seeds))


def _table(
    doc: dict[str, Any], result: SimulationResult, policy: str, tune: float, seeds: str
) -> None:
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
    console.print(t)
    causes = ", ".join(f"{k} {v:.1f}" for k, v in result.failures.items()) or "none"
    console.print(f"failures by cause (mean per seed): {causes}", highlight=False)
