"""Teams' secrets, encrypted in the store, and the env of a job with its references resolved.

A secret is encrypted with Fernet (AES-128-CBC + HMAC-SHA256, `cryptography`) under the
service's key (`secrets.key` in the state dir, 0600): the store holds only ciphertext, a job
record only `{secretRef: NAME}`. `env_of` resolves a job's references at bind time, the only
moment a value is in clear, and hands it to the adapter; `check_refs` refuses at submit a spec
whose references cannot be resolved.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import select

from gpuplane.control.errors import NotFoundError
from gpuplane.control.spec import EnvValue, FromEnv, JobSpec, SecretRef, SpecError, env_refs
from gpuplane.control.statedir import private_file
from gpuplane.control.store.models import Secret
from gpuplane.control.store.records import team_row
from gpuplane.control.store.store import Store

KEY_FILE = "secrets.key"
MAX_SECRET_BYTES = 32 * 1024


@dataclass(frozen=True, slots=True)
class SecretInfo:
    """A secret as `secret list` shows it: its name and when it was set, never its value."""

    team: str
    name: str
    updated_at: float


class Vault:
    """Secrets of every team in `store`; `from_env`: the service's variables jobs may use."""

    def __init__(
        self,
        store: Store,
        key: bytes,
        clock: Callable[[], float],
        from_env: list[str],
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.store = store
        self.fernet = Fernet(key)
        self.clock = clock
        self.from_env = from_env
        self.environ = environ

    def set(self, team: str, name: str, value: str) -> SecretInfo:
        if len(value.encode()) > MAX_SECRET_BYTES:
            raise SpecError(f"secret {name} is over {MAX_SECRET_BYTES} bytes; store a smaller one")
        now = self.clock()
        ciphertext = self.fernet.encrypt(value.encode()).decode()
        with self.store.session() as session, session.begin():
            team_row(session, team)
            row = session.get(Secret, (team, name)) or Secret(team_name=team, name=name)
            row.ciphertext, row.updated_at = ciphertext, now
            session.add(row)
        return SecretInfo(team, name, now)

    def list(self, team: str) -> list[SecretInfo]:
        with self.store.session() as session:
            rows = session.scalars(
                select(Secret).where(Secret.team_name == team).order_by(Secret.name)
            )
            return [SecretInfo(r.team_name, r.name, r.updated_at) for r in rows]

    def delete(self, team: str, name: str) -> None:
        with self.store.session() as session, session.begin():
            row = session.get(Secret, (team, name))
            if row is None:
                raise NotFoundError(
                    f"team {team} has no secret '{name}'; list them with `gpuplane secret list`"
                )
            session.delete(row)

    def check_refs(self, spec: JobSpec) -> None:
        """Refuse a spec referring to a secret its team lacks or a variable not allowed."""
        secrets, names = env_refs(spec)
        refused = sorted(set(names) - set(self.from_env))
        if refused:
            allowed = ", ".join(self.from_env) or "none"
            raise SpecError(
                f"env: fromEnv {', '.join(refused)} is not among the service's variables jobs "
                f"may use (control.auth.from_env: {allowed}); store the value with `gpuplane "
                "secret set` and use secretRef"
            )
        known = {s.name for s in self.list(spec.team)} if secrets else set()
        missing = sorted(set(secrets) - known)
        if missing:
            raise SpecError(
                f"env: team {spec.team} has no secret {', '.join(missing)}; set it with "
                f"`gpuplane secret set {missing[0]} --team {spec.team}`"
            )

    def env_of(self, team: str, env: Mapping[str, EnvValue]) -> dict[str, str]:
        """`env` with each reference replaced by its value; SpecError names one that has gone
        (deleted since submit, a variable the service lacks, or a key that changed)."""
        out = {}
        for var, value in env.items():
            if isinstance(value, SecretRef):
                out[var] = self._reveal(team, value.secretRef)
            elif isinstance(value, FromEnv):
                if value.fromEnv not in self.from_env or value.fromEnv not in self.environ:
                    raise SpecError(
                        f"env {var}: the service has no variable {value.fromEnv} it may pass on"
                    )
                out[var] = self.environ[value.fromEnv]
            else:
                out[var] = value
        return out

    def _reveal(self, team: str, name: str) -> str:
        with self.store.session() as session:
            row = session.get(Secret, (team, name))
        if row is None:
            raise SpecError(f"env: team {team} has no secret '{name}' (deleted since submit?)")
        try:
            return self.fernet.decrypt(row.ciphertext.encode()).decode()
        except InvalidToken:
            raise SpecError(
                f"secret {name} of team {team} was stored under another key than this "
                f"service's {KEY_FILE}; set it again"
            ) from None


def vault_key(state_dir: Path) -> bytes:
    """The service's Fernet key, made at first start."""
    return private_file(state_dir / KEY_FILE, Fernet.generate_key)
