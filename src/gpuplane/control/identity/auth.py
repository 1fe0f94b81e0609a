"""Who may call which route of the control API: roles, the caller, and the one policy table.

Every route of the app is a row of `POLICY` (the app refuses to start with a route missing, and
a test walks every row). A row names the least role the route needs and whether it is team
scoped: a team-scoped route shows a caller who is not an admin only their own team's objects;
another team's answer 404 exactly as an unknown name does, so names do not leak. `decide` is
pure: the API hands it the route's row and the caller (None: no or a bad token).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuplane.errors import GpuplaneError


class Role(StrEnum):
    """What a caller may do: viewers read their team, members also submit and cancel its jobs,
    apply, scale, roll and delete its deployments and keep its secrets; admins manage clusters,
    quotas, teams and tokens for every team."""

    viewer = "viewer"
    member = "member"
    admin = "admin"

    def covers(self, needed: Role) -> bool:
        return _RANK[self] >= _RANK[needed]


_RANK = {Role.viewer: 0, Role.member: 1, Role.admin: 2}


class AuthError(GpuplaneError):
    """The caller is not authenticated (401) or may not do this (403)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: a token's id (or a JWT's subject), its role and team (None for
    an admin token made without one: admins act on every team either way)."""

    subject: str
    role: Role
    team: str | None

    def teams(self) -> set[str] | None:
        """The teams whose objects the caller's lists show; None: all of them."""
        return None if self.role is Role.admin else {self.team or ""}


@dataclass(frozen=True, slots=True)
class Rule:
    """A route's requirement: `role` None is open to anyone (no token needed). A `console` route
    (the web console, `/ui`) takes its caller from the console's session cookie, every other
    route from the bearer token only."""

    role: Role | None
    team_scoped: bool = False
    console: bool = False


OPEN = Rule(None)
VIEW_ANY = Rule(Role.viewer)
VIEW_TEAM = Rule(Role.viewer, team_scoped=True)
MEMBER_TEAM = Rule(Role.member, team_scoped=True)
ADMIN = Rule(Role.admin)
CONSOLE_OPEN = Rule(None, console=True)
CONSOLE_VIEW_ANY = Rule(Role.viewer, console=True)
CONSOLE_VIEW_TEAM = Rule(Role.viewer, team_scoped=True, console=True)
CONSOLE_MEMBER_TEAM = Rule(Role.member, team_scoped=True, console=True)

# (method, route path) -> rule. /metrics needs an admin token: it counts every team's jobs.
POLICY: dict[tuple[str, str], Rule] = {
    ("GET", "/healthz"): OPEN,
    ("GET", "/openapi.json"): OPEN,
    ("GET", "/docs"): OPEN,
    ("GET", "/docs/oauth2-redirect"): OPEN,
    ("GET", "/redoc"): OPEN,
    ("GET", "/metrics"): ADMIN,
    ("GET", "/clusters"): VIEW_ANY,
    ("GET", "/clusters/{name}"): VIEW_ANY,
    ("POST", "/clusters"): ADMIN,
    ("DELETE", "/clusters/{name}"): ADMIN,
    ("POST", "/clusters/{name}/cordon"): ADMIN,
    ("POST", "/clusters/{name}/uncordon"): ADMIN,
    ("POST", "/clusters/{name}/drain"): ADMIN,
    ("GET", "/nodes"): VIEW_ANY,
    ("POST", "/jobs"): MEMBER_TEAM,
    ("POST", "/jobs/batch"): MEMBER_TEAM,
    ("GET", "/jobs"): VIEW_TEAM,
    ("GET", "/jobs/{ref}"): VIEW_TEAM,
    ("POST", "/jobs/{ref}/cancel"): MEMBER_TEAM,
    ("POST", "/jobs/{ref}/move"): ADMIN,  # it chooses cards: an operator's decision
    ("GET", "/jobs/{ref}/logs"): VIEW_TEAM,
    ("GET", "/teams"): VIEW_TEAM,
    ("GET", "/quotas"): VIEW_TEAM,
    ("GET", "/teams/{name}"): VIEW_TEAM,
    ("PUT", "/teams/{name}"): ADMIN,
    ("PUT", "/teams/{name}/quotas/{flavor}"): ADMIN,
    ("GET", "/teams/{name}/secrets"): MEMBER_TEAM,
    ("PUT", "/teams/{name}/secrets/{secret}"): MEMBER_TEAM,
    ("DELETE", "/teams/{name}/secrets/{secret}"): MEMBER_TEAM,
    ("GET", "/events"): VIEW_TEAM,
    ("GET", "/usage"): VIEW_TEAM,
    ("POST", "/deployments"): MEMBER_TEAM,
    ("GET", "/deployments"): VIEW_TEAM,
    # the gateway's discovery and load reports: every team's deployments, with an admin token
    ("GET", "/deployments/watch"): ADMIN,
    ("POST", "/deployments/load"): ADMIN,
    ("GET", "/deployments/{name}"): VIEW_TEAM,
    ("POST", "/deployments/{name}/scale"): MEMBER_TEAM,
    ("GET", "/deployments/{name}/rollout"): VIEW_TEAM,
    ("POST", "/deployments/{name}/promote"): MEMBER_TEAM,
    ("POST", "/deployments/{name}/rollback"): MEMBER_TEAM,
    ("DELETE", "/deployments/{name}"): MEMBER_TEAM,
    ("POST", "/deployments/{name}/faults"): ADMIN,  # drills kill processes: an operator's act
    ("GET", "/tokens"): ADMIN,
    ("POST", "/tokens"): ADMIN,
    ("DELETE", "/tokens/{token_id}"): ADMIN,
    # the web console (`console.py`); its mutations also need the session's CSRF token
    ("GET", "/ui/login"): CONSOLE_OPEN,
    ("POST", "/ui/login"): CONSOLE_OPEN,
    ("POST", "/ui/logout"): CONSOLE_OPEN,
    ("GET", "/ui/console.css"): CONSOLE_OPEN,
    ("GET", "/ui"): CONSOLE_VIEW_ANY,
    ("GET", "/ui/jobs"): CONSOLE_VIEW_TEAM,
    ("GET", "/ui/jobs/{ref}"): CONSOLE_VIEW_TEAM,
    ("POST", "/ui/jobs/{ref}/cancel"): CONSOLE_MEMBER_TEAM,
    ("GET", "/ui/quotas"): CONSOLE_VIEW_TEAM,
    ("GET", "/ui/gpus"): CONSOLE_VIEW_TEAM,  # another team's slices show without their jobs
    ("GET", "/ui/events"): CONSOLE_VIEW_TEAM,
    ("GET", "/ui/deployments"): CONSOLE_VIEW_TEAM,
    ("GET", "/ui/deployments/{name}"): CONSOLE_VIEW_TEAM,
    ("GET", "/ui/runs"): CONSOLE_VIEW_TEAM,
    ("GET", "/ui/runs/{team}/{name}"): CONSOLE_VIEW_TEAM,
}


def decide(rule: Rule, caller: Principal | None) -> None:
    """Allow the call, or raise AuthError saying what is missing."""
    if rule.role is None:
        return
    if caller is None:
        raise AuthError(
            "this needs a bearer token (Authorization: Bearer ...): the CLI reads "
            "GPUPLANE_TOKEN, --token, or the local admin token a loopback server wrote to its "
            "state dir; an admin makes tokens with `gpuplane token create`",
            401,
        )
    if not caller.role.covers(rule.role):
        raise AuthError(
            f"this needs the {rule.role} role; your token is a {caller.role}'s: ask an admin",
            403,
        )


def of_own_team(who: Principal, spec: Any, what: str) -> Any:
    """A member's or viewer's spec (of a job or a deployment: `what`) is their team's: one naming
    none becomes it, one naming another team is refused; an admin's is as written."""
    if who.role is Role.admin or not isinstance(spec, dict):
        return spec
    if spec.get("team") is None:
        return {**spec, "team": who.team}
    if spec["team"] != who.team:
        raise AuthError(
            f"your token is for team {who.team}: submit {what} as team {who.team}, or ask an "
            f"admin for a token of team {spec['team']}",
            403,
        )
    return spec
