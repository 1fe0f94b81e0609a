"""The Redis lease store: the lease is one key that Redis expires itself (`PX`, by Redis's
clock), taken and renewed by one Lua script, so a claim is atomic; the epoch is a counter
beside it that never expires, raised by every acquisition.

Keys, under `gpuplane:lease:<key>`: the lease (`holder\\nepoch\\nurl`), `:epoch` and
`:journal` (a hash: epoch, data), written only by a script that compares epochs first.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from gpuplane.serve.ha.lease import LeaderLease, check_epoch
from gpuplane.serve.ha.settings import HaConfig
from gpuplane.serve.ha.store import Journal, LeaseStore, register

# KEYS: lease, epoch. ARGV: holder, url, ttl_ms. Returns holder, epoch, remaining ms, url.
_CLAIM = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local holder, epoch, url = string.match(cur, '^(.-)\\n(%d+)\\n(.*)$')
  if holder ~= ARGV[1] then
    return {holder, epoch, redis.call('PTTL', KEYS[1]), url}
  end
  redis.call('SET', KEYS[1], holder .. '\\n' .. epoch .. '\\n' .. ARGV[2], 'PX', ARGV[3])
  return {holder, epoch, tonumber(ARGV[3]), ARGV[2]}
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '\\n' .. epoch .. '\\n' .. ARGV[2], 'NX', 'PX', ARGV[3])
return {ARGV[1], tostring(epoch), tonumber(ARGV[3]), ARGV[2]}
"""

# KEYS: lease. ARGV: holder, epoch. Deletes the lease only if it is still that holder's.
_RELEASE = """
local cur = redis.call('GET', KEYS[1])
if cur and cur:sub(1, #ARGV[1] + #ARGV[2] + 2) == ARGV[1] .. '\\n' .. ARGV[2] .. '\\n' then
  redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: epoch, journal. ARGV: epoch, data. Returns the lease's epoch; writes only if not older.
_JOURNAL = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) >= current then
  redis.call('HSET', KEYS[2], 'epoch', ARGV[1], 'data', ARGV[2])
end
return current
"""


@register
class RedisStore(LeaseStore):
    name = "redis"
    errors = (RedisError, OSError)

    def __init__(self, cfg: HaConfig, timeout_s: float) -> None:
        super().__init__(cfg, timeout_s)
        assert cfg.url is not None  # the settings require it for lease: redis
        # no retries of its own: a late answer is no use to a lease, the next claim is the retry
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            cfg.url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        base = f"gpuplane:lease:{cfg.key}"
        self.keys = {"lease": base, "epoch": base + ":epoch", "journal": base + ":journal"}
        self._claim_script: Any = self.client.register_script(_CLAIM)
        self._release_script: Any = self.client.register_script(_RELEASE)
        self._journal_script: Any = self.client.register_script(_JOURNAL)

    async def _claim(self, holder: str, url: str | None, ttl_s: float) -> LeaderLease:
        keys = [self.keys["lease"], self.keys["epoch"]]
        got = await self._claim_script(keys, [holder, url or "", max(1, round(ttl_s * 1000))])
        who, epoch, ttl_ms, at = (v.decode() if isinstance(v, bytes) else v for v in got)
        return LeaderLease(who, int(epoch), int(ttl_ms) / 1000, at or None)

    async def _release(self, holder: str, epoch: int) -> None:
        await self._release_script([self.keys["lease"]], [holder, epoch])

    async def _write_journal(self, epoch: int, data: bytes) -> None:
        current = await self._journal_script(
            [self.keys["epoch"], self.keys["journal"]], [epoch, data]
        )
        check_epoch(int(current), epoch)

    async def _read_journal(self) -> Journal | None:
        got = await self.client.hgetall(self.keys["journal"])
        if not got:
            return None
        data = got[b"data"]
        return Journal(int(got[b"epoch"]), data if isinstance(data, bytes) else data.encode())

    async def _close(self) -> None:
        await self.client.aclose()
