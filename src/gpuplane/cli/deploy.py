"""`gpuplane deploy apply | list | describe | scale | rollout | delete`: deployments on the control
plane; `deploy render`: a spec as another system's manifests, offline."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
import yaml

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    client,
    console,
    fail,
    load_spec,
    print_reasons,
    print_table,
    relative,
    show,
)
from gpuplane.control.adapters import kserve
from gpuplane.control.deployments.spec import parse_deployment
from gpuplane.control.spec import SpecError

app = typer.Typer(
    help="Deploy models: engine instances placed by the scheduler.", no_args_is_help=True
)

NAME = typer.Argument(..., help="deployment name")


@app.command()
def apply(
    file: Path = typer.Argument(..., help="deployment spec (YAML)"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="validate, and say where an instance would go; change nothing"
    ),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Create or change a deployment. A spec that can never be served is refused with why."""
    spec = load_spec(
        file, "deployment", "name, model, engine, replicas, slice, ...", "examples/deploy/sim.yaml"
    )

    def table(data: dict[str, Any]) -> None:
        p = data["placement"]
        verb = "would be" if data["dry_run"] else "is"
        if data["dry_run"]:
            console.print(f"deployment {data['name']} would be {data['action']}", highlight=False)
        else:
            console.print(f"deployment {data['name']} {data['action']}", highlight=False)
        if p["fits"]:
            console.print(
                f"an instance {verb} placed on {p['cluster']}/{p['node']} {_cards(p['devices'])}",
                highlight=False,
            )
        else:
            console.print("an instance would wait now; per cluster:")
            print_reasons(p["reasons"])

    show(server, token, output, lambda c: c.apply_deployment(spec, dry_run=dry_run), table)


class DeployTarget(StrEnum):
    kserve = "kserve"


@app.command()
def render(
    file: Path = typer.Argument(..., help="deployment spec (YAML)"),
    target: DeployTarget = typer.Option(..., "--target", help="what to render it as"),
    image: str = typer.Option(
        ..., "--image", help="the container image holding the engine (e.g. vllm/vllm-openai)"
    ),
    namespace: str | None = typer.Option(None, "--namespace", help="the manifests' namespace"),
) -> None:
    """Print a deployment as YAML manifests. kserve: one InferenceService per version, raw
    deployment mode, HAMi resources; no control plane needed."""
    data = load_spec(
        file, "deployment", "name, model, engine, replicas, slice, ...", "examples/deploy/sim.yaml"
    )
    try:
        manifests = kserve.render(parse_deployment(data), image=image, namespace=namespace)
    except SpecError as exc:
        fail(str(exc))
    typer.echo(yaml.safe_dump_all(manifests, sort_keys=False), nl=False)


def _cards(devices: list[int]) -> str:
    return f"cards {devices}" if devices else "(no GPU)"


@app.command("list")
def list_(
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Deployments with their instances: running, pending, draining."""

    def table(rows: list[dict[str, Any]]) -> None:
        print_table(
            [
                "NAME",
                "MODEL",
                "VERSION",
                "ENGINE",
                "TEAM",
                "REPLICAS",
                "RUNNING",
                "PENDING",
                "DRAINING",
                "STATE",
            ],
            [
                (
                    d["name"],
                    d["model"],
                    d["version"],
                    d["engine"],
                    d["team"],
                    d["replicas"],
                    d["running"],
                    d["pending"],
                    d["draining"],
                    "deleting" if d["deleting"] else "active",
                )
                for d in rows
            ],
        )

    show(server, token, output, lambda c: c.deployments(), table)


@app.command()
def describe(
    name: str = NAME,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show a deployment: spec, instances and events. Instances with their state, cluster/node/cards
    and URL."""
    show(server, token, output, lambda c: c.deployment(name), _describe_table)


def _describe_table(d: dict[str, Any]) -> None:
    import time

    now = time.time()
    console.print(
        f"deployment {d['name']}: {d['engine']} {d['model']} version {d['version']}, "
        f"{d['replicas']} replica(s), team {d['team']}" + (" (deleting)" if d["deleting"] else ""),
        highlight=False,
    )
    print_table(
        ["INSTANCE", "VERSION", "STATE", "WHERE", "URL", "IN USE", "REASON"],
        [
            (
                i["id"],
                i["version"],
                i["state"],
                f"{i['cluster']}/{i['node']} {_cards(i['devices'])}" if i["cluster"] else "-",
                i["url"] or "-",
                f"{'-' if i['in_use'] is None else i['in_use']}/{i['capacity'] or '?'}",
                i["reason"] or "-",
            )
            for i in d["instances"]
        ],
        title="instances",
        drop=("URL", "VERSION", "IN USE"),
    )
    print_table(
        ["WHEN", "EVENT"],
        [(relative(e["at"], now), e["message"]) for e in d["events"]],
        title="events",
    )


@app.command()
def scale(
    name: str = NAME,
    replicas: int = typer.Argument(..., min=0, help="instances of its current version"),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Set a deployment's replicas. Surplus instances drain before they stop."""
    show(server, token, output, lambda c: c.scale_deployment(name, replicas), _describe_table)


rollout_app = typer.Typer(
    help="Roll a deployment's versions out and back.\n\nIts versions' weights, promote a "
    "canary, roll back.",
    no_args_is_help=True,
)
app.add_typer(rollout_app, name="rollout")


@rollout_app.command("status")
def rollout_status(
    name: str = NAME,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show each version's share of requests. Per version: its share of requests and its instances
    (wanted, running, ready, draining)."""
    show(server, token, output, lambda c: c.rollout(name), _rollout_table)


@rollout_app.command()
def promote(
    name: str = NAME,
    version: str | None = typer.Option(
        None, "--version", help="the canary to promote (needed when there are several)"
    ),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Make the canary the deployment's version. Its instances stay; the old version's drain once it
    serves the deployment's replicas."""
    show(server, token, output, lambda c: c.rollout(name, "promote", version), _rollout_table)


@rollout_app.command()
def rollback(
    name: str = NAME,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Drop the canaries. Their instances drain; the version serves every request."""
    show(server, token, output, lambda c: c.rollout(name, "rollback"), _rollout_table)


def _rollout_table(d: dict[str, Any]) -> None:
    print_table(
        ["VERSION", "WEIGHT", "REPLICAS", "RUNNING", "READY", "DRAINING"],
        [
            (
                v["version"] + (" (main)" if v["version"] == d["version"] else ""),
                f"{v['weight']:g} %",
                v["replicas"],
                v["running"],
                "-" if v["ready"] is None else v["ready"],
                v["draining"],
            )
            for v in d["versions"]
        ],
        title=f"deployment {d['name']}",
    )


@app.command()
def delete(
    name: str = NAME, server: str | None = SERVER_OPTION, token: str | None = TOKEN_OPTION
) -> None:
    """Delete a deployment. Its instances drain (no new requests), then stop."""
    with client(server, token) as c:
        c.delete_deployment(name)
    console.print(f"deployment {name} is deleting: its instances drain, then stop", highlight=False)
