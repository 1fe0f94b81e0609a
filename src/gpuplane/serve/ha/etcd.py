"""The etcd lease store, over etcd's v3 JSON gateway (`/v3/...`, etcd 3.4 and later).

The leader lease is a key bound to an etcd lease, which etcd expires by its own clock; it is
created by a transaction that succeeds only while the key does not exist, renewed by keeping
the etcd lease alive, and given up by revoking it. The epoch is the key's create revision,
which etcd's global revision makes grow on every creation. The journal is written by a
transaction that compares the lease key's create revision with the writer's epoch.

etcd grants TTLs in whole seconds, at least about 1.5 x its election timeout (2 s with the
default 1 s): `lease_ttl_s` is rounded up to what etcd grants, and the leader counts with the
TTL etcd answered.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import httpx

from gpuplane.serve.ha.lease import Fenced, LeaderLease
from gpuplane.serve.ha.settings import HaConfig
from gpuplane.serve.ha.store import Journal, LeaseStore, register


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


class EtcdError(Exception):
    """etcd answered with an error body (not a transport failure)."""


@register
class EtcdStore(LeaseStore):
    name = "etcd"
    errors = (httpx.HTTPError, EtcdError, OSError, ValueError, KeyError)

    def __init__(self, cfg: HaConfig, timeout_s: float) -> None:
        super().__init__(cfg, timeout_s)
        assert cfg.url is not None  # the settings require it for lease: etcd
        self.client = httpx.AsyncClient(base_url=cfg.url.rstrip("/"), timeout=timeout_s)
        self.lease_key = f"gpuplane/lease/{cfg.key}"
        self.journal_key = f"gpuplane/lease/{cfg.key}/journal"
        self._lease_id: str | None = None  # the etcd lease this gateway's claim holds
        self._epoch = 0

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self.client.post(path, json=body)
        data: dict[str, Any] = resp.json()
        if resp.status_code != 200 or "error" in data:
            raise EtcdError(f"{path}: {data.get('message') or data.get('error') or resp.text}")
        return data

    async def _claim(self, holder: str, url: str | None, ttl_s: float) -> LeaderLease:
        if self._lease_id is not None:
            alive = await self._post("/v3/lease/keepalive", {"ID": self._lease_id})
            left = int(alive.get("result", {}).get("TTL", 0))
            if left > 0:
                return LeaderLease(holder, self._epoch, float(left), url)
            self._lease_id = None  # it ran out: claim afresh below
        grant = await self._post("/v3/lease/grant", {"TTL": math.ceil(ttl_s)})
        lease_id, ttl = str(grant["ID"]), float(grant["TTL"])
        key = _b64(self.lease_key)
        value = _b64(f"{holder}\n{url or ''}")
        txn = await self._post(
            "/v3/kv/txn",
            {
                "compare": [
                    {"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
                ],
                "success": [{"request_put": {"key": key, "value": value, "lease": lease_id}}],
                "failure": [{"request_range": {"key": key}}],
            },
        )
        if txn.get("succeeded"):
            self._lease_id, self._epoch = lease_id, int(txn["header"]["revision"])
            return LeaderLease(holder, self._epoch, ttl, url)
        await self._post("/v3/lease/revoke", {"ID": lease_id})
        kvs = txn["responses"][0]["response_range"].get("kvs", [])
        if not kvs:  # deleted between the compare and the range: nobody holds it
            return LeaderLease("", 0, 0.0)
        kv = kvs[0]
        who, _, at = _unb64(kv["value"]).decode().partition("\n")
        held = await self._post("/v3/lease/timetolive", {"ID": kv.get("lease", "0")})
        return LeaderLease(who, int(kv["create_revision"]), float(held.get("TTL", 0)), at or None)

    async def _release(self, holder: str, epoch: int) -> None:
        if self._lease_id is not None and epoch == self._epoch:
            lease_id, self._lease_id = self._lease_id, None
            resp = await self.client.post("/v3/lease/revoke", json={"ID": lease_id})
            if resp.status_code != 200 and "not found" not in resp.text:
                raise EtcdError(resp.text)

    async def _write_journal(self, epoch: int, data: bytes) -> None:
        txn = await self._post(
            "/v3/kv/txn",
            {
                "compare": [
                    {
                        "key": _b64(self.lease_key),
                        "target": "CREATE",
                        "result": "EQUAL",
                        "create_revision": str(epoch),
                    }
                ],
                "success": [
                    {
                        "request_put": {
                            "key": _b64(self.journal_key),
                            "value": _b64(f"{epoch}\n".encode() + data),
                        }
                    }
                ],
            },
        )
        if not txn.get("succeeded"):
            raise Fenced(
                f"a write in epoch {epoch} was refused: the lease is no longer in that epoch "
                "(it ran out or another gateway took it); this gateway stops admitting"
            )

    async def _read_journal(self) -> Journal | None:
        got = await self._post("/v3/kv/range", {"key": _b64(self.journal_key)})
        kvs = got.get("kvs", [])
        if not kvs:
            return None
        epoch, _, data = _unb64(kvs[0]["value"]).partition(b"\n")
        return Journal(int(epoch), data)

    async def _close(self) -> None:
        await self.client.aclose()
