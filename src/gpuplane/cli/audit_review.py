"""`gpuplane audit findings|recommend|plan|apply|usage|report|fleet`: read a sample store (or the
seed-like fleet), print what the audit finds; `apply` carries a saved plan's job moves out on a
live control plane. Thin: parse, call `gpuplane.audit` (or the control API), print.

Every command reads the same inputs: `--store DIR` (the sample store `audit collect` writes) and
`--traffic DIR` (the gateway's traffic store), or `--fleet SEED` (the generated seed-like fleet,
no store needed); thresholds from the `audit:` section of `--config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpuplane.audit.apply import LiveJob, PlanError, job_moves, load_plan, plan_state, save_plan
from gpuplane.audit.pipeline import Audit, run_audit
from gpuplane.audit.settings import AuditSettings
from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    client,
    emit,
    fail,
    mib,
    print_table,
)
from gpuplane.cli.usage import print_usage
from gpuplane.control.client import ClientError, ControlClient
from gpuplane.errors import GpuplaneError

STORE = typer.Option(None, "--store", help="the sample store (a directory `audit collect` wrote)")
TRAFFIC = typer.Option(None, "--traffic", help="the gateway's traffic store (for zero_traffic)")
FLEET = typer.Option(None, "--fleet", help="audit the seed-like fleet of this seed instead")
CONFIG = typer.Option(None, "--config", help="gpuplane.yaml; its audit: section sets thresholds")
PLANS = typer.Option(Path(".gpuplane/audit/plans"), "--plans", help="where plans are kept")


def _settings(config: Path | None) -> AuditSettings:
    from gpuplane.config import load_settings

    return load_settings(config).audit


def _inputs(store: Path | None, traffic: Path | None, fleet: int | None) -> tuple[Any, Any]:
    """The samples and traffic to audit: the stores, or the generated fleet's tables."""
    from gpuplane.audit.sample_store import SampleStore
    from gpuplane.audit.samples import TRAFFIC_SCHEMA

    if (store is None) == (fleet is None):
        fail("give --store DIR (a sample store) or --fleet SEED (the seed-like fleet), not both")
    if fleet is not None:
        from gpuplane.audit.fleet import generate

        f = generate(fleet)
        return f.samples(), f.traffic()
    assert store is not None
    if not store.is_dir():
        fail(f"--store {store} is not a directory; collect samples with `gpuplane audit collect`")
    return SampleStore(store), SampleStore(traffic, TRAFFIC_SCHEMA) if traffic else None


def _audit(samples: Any, traffic: Any, cfg: AuditSettings) -> Audit:
    """Run the audit; an error exits non-zero, saying why."""
    try:
        return run_audit(samples, traffic, cfg)
    except (GpuplaneError, ValueError) as exc:
        fail(str(exc))
        raise  # unreachable: fail exits


def register(app: typer.Typer) -> None:
    """Add the commands to `gpuplane audit` (part A's collect lives in cli/audit.py)."""
    app.command()(findings)
    app.command()(recommend)
    app.command()(plan)
    app.command()(apply)
    app.command()(usage)
    app.command()(report)
    app.command()(fleet)


def findings(
    store: Path | None = STORE,
    traffic: Path | None = TRAFFIC,
    fleet: int | None = FLEET,
    config: Path | None = CONFIG,
    output: Output = OUTPUT_OPTION,
) -> None:
    """List idle, oversized and zero-traffic workloads. Idle, idle_held, oversized and zero-traffic
    workloads and fragmented nodes, with the numbers."""
    a = _audit(*_inputs(store, traffic, fleet), _settings(config))
    data = [f.to_json() for f in a.findings]

    def table(rows: list[dict[str, Any]]) -> None:
        print_table(
            ["KIND", "SUBJECT", "TEAM", "NODE", "WHY"],
            [[r["kind"], r["subject"], r["team"], r["node"], r["message"]] for r in rows],
        )
        if not a.traffic:
            typer.echo("no --traffic: zero_traffic was not evaluated", err=True)

    emit(data, output, table)


def recommend(
    store: Path | None = STORE,
    traffic: Path | None = TRAFFIC,
    fleet: int | None = FLEET,
    config: Path | None = CONFIG,
    output: Output = OUTPUT_OPTION,
) -> None:
    """The right-sized slice of every workload, next to what it holds."""
    a = _audit(*_inputs(store, traffic, fleet), _settings(config))
    data = [
        {
            "workload": r.workload,
            "team": r.team,
            "kind": r.kind,
            "node": r.node,
            "card": r.card,
            "alloc_mem_mib": r.alloc_mem_mib,
            "alloc_cores_pct": r.alloc_cores_pct,
            "peak_mem_mib": round(r.peak_mib, 1),
            "mem_mib": r.mem_mib,
            "cores_pct": r.cores_pct,
            "mig_profile": r.profile,
        }
        for r in sorted(a.recommendations.values(), key=lambda r: r.workload)
    ]

    def table(rows: list[dict[str, Any]]) -> None:
        print_table(
            ["WORKLOAD", "TEAM", "KIND", "HOLDS", "PEAK", "RECOMMENDED"],
            [
                [
                    r["workload"],
                    r["team"],
                    r["kind"],
                    f"{mib(r['alloc_mem_mib'])} {r['alloc_cores_pct']}%",
                    mib(int(r["peak_mem_mib"])),
                    r["mig_profile"] or f"{mib(r['mem_mib'])} {r['cores_pct']}%",
                ]
                for r in rows
            ],
        )

    emit(data, output, table)


def plan(
    store: Path | None = STORE,
    traffic: Path | None = TRAFFIC,
    fleet: int | None = FLEET,
    config: Path | None = CONFIG,
    plans: Path = PLANS,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Plan a re-pack (a dry run: nothing changes). Moves ordered by savings, cards freed; the
    plan is kept under --plans by its id."""
    a = _audit(*_inputs(store, traffic, fleet), _settings(config))
    data = a.plan.to_json()
    save_plan(plans, data)

    def table(d: dict[str, Any]) -> None:
        print_table(
            ["#", "ACTION", "WORKLOAD", "TEAM", "FROM", "TO", "SLICE"],
            [
                [i + 1, m["action"], m["workload"], m["team"], m["from_card"],
                 m["to_card"] if m["action"] != "retire" else "-",
                 f"{mib(m['mem_mib'])} {m['gpu_milli'] / 10:g}%"]
                for i, m in enumerate(d["moves"])
            ],
        )  # fmt: skip
        typer.echo(
            f"plan {d['id']} ({d['policy']}): {d['held_before']} cards held -> "
            f"{d['held_after']}, frees {d['freed']} ({d['freed_ratio']:.0%}); "
            f"{d['violations']} placement violations. Dry run: nothing changed."
        )

    emit(data, output, table)


def apply(
    plan_id: str = typer.Argument(..., help="the id `gpuplane audit plan` printed"),
    plans: Path = PLANS,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    yes: bool = typer.Option(False, "--yes", help="do not ask before moving"),
    jobs_only: bool = typer.Option(
        False, "--jobs-only", help="apply the job moves even though deployments' are skipped"
    ),
) -> None:
    """Carry out a saved plan's job moves. On the control plane, in the plan's order: each job is
    re-placed on its target node keeping its id (its process stopped, requeued there). Refused when
    the plan was changed or the placements moved since; a re-run skips moves done."""
    try:
        data = load_plan(plans, plan_id)
    except PlanError as exc:
        fail(str(exc))
        raise  # unreachable: fail exits
    moves = job_moves(data)
    with client(server, token) as c:
        live = _live_jobs(c, sorted({*data["placements"], *moves}))
        held = {j["id"] for s in ("admitted", "running") for j in c.jobs(state=s)}
        state = plan_state(data, live, sorted(held - set(data["placements"])))
        if state.changed:
            fail(
                f"plan {plan_id} is stale: the placements changed since it was made: "
                + "; ".join(state.changed)
                + "; make a new plan with `gpuplane audit plan`"
            )
        if state.deployments:
            message = (
                f"deployments are not implemented yet; {len(state.deployments)} inference moves "
                "skipped"
            )
            if not jobs_only:
                fail(message + "; pass --jobs-only to apply the job moves alone")
            typer.echo(message, err=True)
        if state.left:
            typer.echo(
                f"{len(state.left)} job resize, retire or same-node steps left as they are",
                err=True,
            )
        print_table(
            ["#", "JOB", "FROM", "TO", "SLICE", ""],
            [[i + 1, m["workload"], m["from_card"], f"{m['to_cluster']}/{m['to_card']}",
              f"{mib(m['mem_mib'])} {m['gpu_milli'] / 10:g}%",
              "done" if m in state.done else ""]
             for i, m in enumerate([*state.done, *state.todo])],
        )  # fmt: skip
        if not state.todo:
            typer.echo(f"plan {plan_id}: nothing to do ({len(state.done)} job moves done)")
            return
        if not yes and not typer.confirm(f"move {len(state.todo)} jobs?"):
            fail("nothing moved")
        for k, m in enumerate(state.todo):
            body = {
                "cluster": m["to_cluster"],
                "node": m["to_node"],
                "gpu_mem_mib": m["mem_mib"],
                "gpu_cores_pct": max(1, -(-m["gpu_milli"] // 10)),
                "reason": f"moved by audit plan {plan_id}",
            }
            try:
                c.move(m["workload"], body)
            except ClientError as exc:
                fail(
                    f"moving job {m['workload']} failed: {exc}; moved {k} of {len(state.todo)} "
                    f"(not moved: {', '.join(x['workload'] for x in state.todo[k:])}); "
                    "re-run `gpuplane audit apply` to go on from there"
                )
            typer.echo(f"moved {m['workload']} to {m['to_cluster']}/{m['to_node']}")
        typer.echo(f"plan {plan_id}: {len(state.todo)} jobs moved, {len(state.done)} already done")


def _live_jobs(c: ControlClient, workloads: list[str]) -> dict[str, LiveJob | None]:
    """Each workload's job as the control plane has it now; None for one it does not know."""
    live: dict[str, LiveJob | None] = {}
    for w in workloads:
        try:
            view = c.job(w)
        except ClientError as exc:
            if exc.status != 404:
                raise
            view = None
        # not a control-plane job (the API also finds a job by name): a deployment
        live[w] = LiveJob.of(view) if view is not None and view["id"] == w else None
    return live


def usage(
    store: Path | None = STORE,
    traffic: Path | None = TRAFFIC,
    fleet: int | None = FLEET,
    config: Path | None = CONFIG,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show GPU-hours and cost per team. Slice-hours count a slice's share of the card, idle apart,
    cost from audit.prices; reconciled to the physical GPU-hours."""
    from gpuplane.audit.usage import usage as team_usage

    cfg = _settings(config)
    source, tr = _inputs(store, traffic, fleet)
    a = _audit(source, tr, cfg)
    u = team_usage(source, a.stats.window, cfg)
    emit(u.to_json(), output, print_usage)


def report(
    out: Path = typer.Option(Path("audit-report.html"), "--out", help="the HTML file to write"),
    store: Path | None = STORE,
    traffic: Path | None = TRAFFIC,
    fleet: int | None = FLEET,
    config: Path | None = CONFIG,
) -> None:
    """Write the standalone HTML report (plots inline, no external URL)."""
    from gpuplane.audit.recommend import replay
    from gpuplane.audit.report import write_report
    from gpuplane.audit.usage import usage as team_usage

    cfg = _settings(config)
    source, tr = _inputs(store, traffic, fleet)
    a = _audit(source, tr, cfg)
    u = team_usage(source, a.stats.window, cfg)
    rp = replay(source, a.recommendations.values())
    typer.echo(f"wrote {write_report(a, u, out, rp)}")


def fleet(
    out: Path = typer.Option(..., "--out", help="the sample store to write (a directory)"),
    traffic_out: Path | None = typer.Option(None, "--traffic-out", help="its traffic store"),
    seed: int = typer.Option(0, "--seed", help="the fleet's seed"),
) -> None:
    """Write a seed-like fleet's samples into stores. Its samples (and traffic), to audit like real
    ones."""
    from gpuplane.audit.fleet import generate
    from gpuplane.audit.sample_store import SampleStore
    from gpuplane.audit.samples import TRAFFIC_SCHEMA

    f = generate(seed)
    SampleStore(out).append(f.samples())
    if traffic_out is not None:
        SampleStore(traffic_out, TRAFFIC_SCHEMA).append(f.traffic())
    typer.echo(f"wrote {len(f.workloads)} workloads on {f.spec.cards} cards into {out}")
