"""Team and quota edits through the API (`PUT /teams/{name}`, `PUT /teams/{name}/quotas/{flavor}`,
`gpuplane quota set`), and the rule that divides them from the config file: what a
`control.teams` entry states, the file owns (applied at every start, refused here: a change
would be silently undone at the next restart); what it leaves out, these edits own, and a
restart keeps them (`service._apply_team_config`).
"""

from __future__ import annotations

from typing import Any

from gpuplane.control.errors import ConflictError
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import QuotaConfig
from gpuplane.control.spec import SpecError, check_name
from gpuplane.control.store.models import Quota, Team
from gpuplane.control.store.queries import get_team
from gpuplane.control.store.records import quota_row
from gpuplane.control.store.views import QuotaSet, TeamSet, TeamView


def _not_set_in_config(service: ControlService, team: str, wanted: dict[str, Any]) -> None:
    """Refuse changing what the config file's entry for `team` states (`wanted`: field -> the
    value it would have): every start applies the entry again, so the change would be silently
    undone (`settings.TeamConfig`)."""
    entry = next((t for t in service.config.teams if t.name == team), None)
    owned = [f for f, v in wanted.items() if entry and entry.states(f) and v != getattr(entry, f)]
    if owned:
        what = " and ".join(owned)
        raise ConflictError(
            f"the config file sets team {team}'s {what} (control.teams) and applies it again at "
            "every start, so a change here would be undone: change it there and restart, or "
            f"leave {what} out of the team's entry to set it here"
        )


def set_team(service: ControlService, name: str, body: TeamSet) -> TeamView:
    check_name("team", name)
    if body.cohort is not None:
        check_name("cohort", body.cohort)
    _not_set_in_config(service, name, {"cohort": body.cohort, "weight": body.weight})
    with service.locked() as (session, _):
        team = session.get(Team, name) or Team(name=name)
        team.cohort, team.weight = body.cohort, body.weight
        session.add(team)
        service.invalidate()  # inside the lock: no pass may run on the old quotas
    return get_team(service, name)


def set_quota(service: ControlService, team: str, flavor: str, body: QuotaSet) -> TeamView:
    check_name("team", team)
    estate, _ = service.estate()
    if flavor not in estate.flavors:
        known = ", ".join(sorted(estate.flavors)) or "none"
        raise SpecError(f"no GPU model '{flavor}' in the inventory; known models: {known}")
    entry = next((t for t in service.config.teams if t.name == team), None)
    if entry is not None:  # the entry's quotas with this one put: unchanged, or refused
        new = QuotaConfig(flavor=flavor, **body.model_dump())
        put = [new if q.flavor == flavor else q for q in entry.quotas]
        _not_set_in_config(service, team, {"quotas": put if new in put else [*put, new]})
    with service.locked() as (session, _):
        if session.get(Team, team) is None:
            session.add(Team(name=team))
            session.flush()
        existing = session.get(Quota, (team, flavor))
        if existing is not None:
            session.delete(existing)
            session.flush()
        session.add(quota_row(team, flavor, body))
        service.invalidate()  # inside the lock: no pass may run on the old quotas
    return get_team(service, team)
