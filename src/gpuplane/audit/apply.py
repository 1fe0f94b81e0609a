"""What `gpuplane audit apply` does with a saved plan: the pure part (the CLI does the I/O).

A plan is saved with a checksum over its content (`save_plan`); `load_plan` refuses a file whose
content or id no longer match it. Before anything moves, the live placements are compared with
the plan's inputs (`plan_state`): every job the plan placed must still be where the plan found it,
or, for one the plan moves, already on the move's target (a move done by an earlier, partial
apply: skipped, so a re-run is idempotent); a job that ended or is held elsewhere, or one placed
since the plan, makes the plan stale. Only job `move` steps are carried out (as re-placements
that keep the job id, `POST /jobs/{ref}/move`, pinned to the target node; the policy picks the
card there); deployments' steps are not implemented yet, and a job's `resize`, `retire` or move
between cards of its own node is left as is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuplane.errors import GpuplaneError, unknown_name
from gpuplane.resources import LABEL_NODE

ACTIVE = ("pending", "admitted", "running")


class PlanError(GpuplaneError):
    """The saved plan cannot be applied: missing, edited, or stale."""


def _checksum(data: Mapping[str, Any]) -> str:
    body = json.dumps({k: v for k, v in data.items() if k != "checksum"}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def save_plan(plans: Path, data: Mapping[str, Any]) -> Path:
    """Write the plan as `<id>.json` under `plans`, with the checksum `load_plan` verifies."""
    plans.mkdir(parents=True, exist_ok=True)
    path = plans / f"{data['id']}.json"
    path.write_text(json.dumps({**data, "checksum": _checksum(data)}, indent=1))
    return path


def load_plan(plans: Path, plan_id: str) -> dict[str, Any]:
    """The plan saved as `plan_id`, refused when its content or id were changed since."""
    path = plans / f"{plan_id}.json"
    if not path.is_file():
        saved = sorted(p.stem for p in plans.glob("*.json")) if plans.is_dir() else []
        raise PlanError(
            unknown_name(f"plan under {plans}", plan_id, saved)
            + "; make one with `gpuplane audit plan`"
        )
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except ValueError as exc:
        why = f"{path} is not a plan ({exc}); make one with `gpuplane audit plan`"
        raise PlanError(why) from None
    if data.get("id") != plan_id or data.get("checksum") != _checksum(data):
        raise PlanError(
            f"plan {plan_id} does not match its content ({path} was changed after "
            "`gpuplane audit plan` wrote it); make a new plan with `gpuplane audit plan`"
        )
    return data


@dataclass(frozen=True, slots=True)
class LiveJob:
    """A control-plane job as `apply` compares it: where it is held now (`node`/`card` None when
    not placed) and the node it is pinned to, if any."""

    id: str
    state: str
    cluster: str | None
    node: str | None
    card: str | None
    pinned: tuple[str, str] | None

    @classmethod
    def of(cls, view: Mapping[str, Any]) -> LiveJob:
        """From the API's job view."""
        sel = view.get("selector") or {}
        pin_node = (sel.get("match_labels") or {}).get(LABEL_NODE)
        pinned = (sel["cluster"], pin_node) if pin_node and sel.get("cluster") else None
        devices, node = view.get("devices") or [], view.get("node")
        card = f"{node}/{devices[0]}" if node and devices else None
        return cls(view["id"], view["state"], view.get("cluster"), node, card, pinned)


@dataclass(slots=True)
class PlanState:
    """The plan against the live control plane: job moves to do (in the plan's order) and done,
    deployments' steps (not applied), steps left as they are, and what changed since the plan."""

    todo: list[dict[str, Any]] = field(default_factory=list)
    done: list[dict[str, Any]] = field(default_factory=list)
    deployments: list[dict[str, Any]] = field(default_factory=list)
    left: list[dict[str, Any]] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)


def job_moves(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The plan's job `move` steps to another node, by workload (a job cannot be pinned to a
    card: a move between cards of one node is left as is)."""
    return {
        m["workload"]: m
        for m in data["moves"]
        if (m["kind"], m["action"]) == ("batch", "move") and m["from_node"] != m["to_node"]
    }


def plan_state(
    data: Mapping[str, Any], live: Mapping[str, LiveJob | None], placed_since: Sequence[str]
) -> PlanState:
    """Compare the plan's inputs with the live jobs: `live` has each workload of the plan (None:
    not a control-plane job, i.e. a deployment), `placed_since` the jobs holding cards now that
    the plan does not know."""
    out = PlanState()
    moves = job_moves(data)
    for w, (cluster, node, card, *_) in sorted(data["placements"].items()):
        job, move = live.get(w), moves.get(w)
        where = f"{cluster}/{card}"
        if job is None:
            if move is not None:
                out.changed.append(f"job {w} (planned on {where}) no longer exists")
            continue
        if job.state not in ACTIVE:
            out.changed.append(f"job {w} is {job.state} (planned running on {where})")
            continue
        if move is not None:
            target = (move["to_cluster"], move["to_node"])
            if (job.cluster, job.node) == target or (
                job.state == "pending" and job.pinned == target
            ):
                out.done.append(move)
                continue
        if job.node is None:
            out.changed.append(f"job {w} is {job.state} (planned running on {where})")
        elif (job.cluster, job.node) != (cluster, node) or (
            card.startswith(f"{node}/") and job.card != card
        ):
            out.changed.append(f"job {w} is on {job.cluster}/{job.card} (planned on {where})")
        elif move is not None:
            out.todo.append(move)
    out.changed += [f"job {j} was placed after the plan was made" for j in placed_since]
    order = {id(m): k for k, m in enumerate(data["moves"])}
    out.todo.sort(key=lambda m: order[id(m)])
    for m in data["moves"]:
        if m["kind"] != "batch":
            out.deployments.append(m)
        elif m["workload"] not in moves:
            out.left.append(m)
    return out
