-- gpuplane's shared slot table (gateway.ha.mode: shared): one Redis sorted set per instance,
-- member = lease id "<gateway>|<epoch>|<n>", score = its expiry in Redis server milliseconds.
-- Every script reads the clock with TIME (never a gateway's clock), purges what has expired
-- first, and answers {status, ...}: 1 done, 0 refused (full), -2 the table's incarnation is not
-- the caller's (Redis lost its data or was reset: re-sync), -3 the caller's epoch is older than
-- the one registered for its gateway id (a newer process took the id over), -4 a lease that is
-- not the caller's. Scripts are separated by a line "--- NAME".

--- now
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Purge the instance's expired leases. Their requests may still run on the engine (their
-- gateway paused past the TTL): each stays counted, in the sorted set KEY..':lapsed' (lease id
-- -> its expiry), until its gateway releases or registers it again, or an engine reading lowers
-- the count (`drain`). Answers how many it holds.
local function purge(key, now)
  local lapsed = key .. ':lapsed'
  local gone = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'WITHSCORES')
  for i = 1, #gone, 2 do redis.call('ZADD', lapsed, gone[i + 1], gone[i]) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', key, '-inf', now) end
  return redis.call('ZCARD', lapsed)
end

-- {status, n, then every lease id in the set}: a gateway learns who holds what
local function holders(status, n, key)
  local answer = {status, n}
  for _, lease in ipairs(redis.call('ZRANGE', key, 0, -1)) do answer[#answer + 1] = lease end
  return answer
end

--- acquire
-- KEYS: incarnation, epochs (hash gateway -> epoch), the instance's set
-- ARGV: incarnation, gateway, epoch, lease, capacity, ttl_ms
-- Answers {status, the expired leases still counted, then the set's lease ids after it}.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-2, 0} end
local registered = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if registered > tonumber(ARGV[3]) then return {-3, 0} end
local now = now_ms()
local open = purge(KEYS[3], now)
local expiry = now + tonumber(ARGV[6])
if redis.call('ZSCORE', KEYS[3], ARGV[4]) then  -- a retried acquire that had landed
  redis.call('ZADD', KEYS[3], expiry, ARGV[4])
  return holders(1, open, KEYS[3])
end
if redis.call('ZCARD', KEYS[3]) + open >= tonumber(ARGV[5]) then
  return holders(0, open, KEYS[3])
end
redis.call('ZADD', KEYS[3], expiry, ARGV[4])
return holders(1, open, KEYS[3])

--- renew
-- Extend (or register again: after a re-sync, or one whose renewal came late) the caller's own
-- leases on one instance; with no lease it only looks. Registers the caller's epoch.
-- Answers {status, the expired leases still counted, then the set's lease ids}.
-- KEYS: incarnation, epochs, the instance's set
-- ARGV: incarnation, gateway, epoch, ttl_ms, lease...
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-2, 0} end
local registered = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
local epoch = tonumber(ARGV[3])
if registered > epoch then return {-3, 0} end
local mine = ARGV[2] .. '|' .. ARGV[3] .. '|'
for i = 5, #ARGV do
  if string.sub(ARGV[i], 1, #mine) ~= mine then return {-4, 0} end
end
if registered < epoch then redis.call('HSET', KEYS[2], ARGV[2], epoch) end
local now = now_ms()
purge(KEYS[3], now)
for i = 5, #ARGV do
  redis.call('ZREM', KEYS[3] .. ':lapsed', ARGV[i])  -- counted once: live again
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[i])
end
return holders(1, redis.call('ZCARD', KEYS[3] .. ':lapsed'), KEYS[3])

--- release
-- Idempotent: 1 the first time, 0 afterwards. An expired lease's request has ended too.
-- KEYS: the instance's set; ARGV: lease
return redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[1] .. ':lapsed', ARGV[1])

--- drain
-- An engine reading that began at server time ARGV[1] (ms) counted ARGV[2] requests (-1: the
-- engine gave no count); ARGV[4...] are the reader's leases surely on the engine throughout.
-- Those of them still live are not lapsed, so at most ARGV[2] - (them) requests of leases
-- expired by then still run. Keeps that many of those (the latest to
-- expire), every lease expired since, and none that expired more than ARGV[3] ms ago (past any
-- request's deadline). KEYS: the instance's set. Answers the expired leases still counted.
local lapsed = KEYS[1] .. ':lapsed'
local began = tonumber(ARGV[1])
local now = now_ms()
purge(KEYS[1], now)
redis.call('ZREMRANGEBYSCORE', lapsed, '-inf', '(' .. (now - tonumber(ARGV[3])))
local load = tonumber(ARGV[2])
if load >= 0 then
  local sure = 0
  for i = 4, #ARGV do
    if redis.call('ZSCORE', KEYS[1], ARGV[i]) then sure = sure + 1 end
  end
  local extra = redis.call('ZCOUNT', lapsed, '-inf', began) - math.max(0, load - sure)
  if extra > 0 then redis.call('ZREMRANGEBYRANK', lapsed, 0, extra - 1) end
end
return redis.call('ZCARD', lapsed)

--- heartbeat
-- The caller is live for ttl_ms, and says which incarnation it has registered its leases under
-- ('' while it has not). Starts a new incarnation, named ARGV[4], when there is none (first
-- start, or Redis lost its data) or when the caller asks (ARGV[5] = '1': it comes back from a
-- time it could not reach Redis, and admitted on its local share: every gateway registers its
-- leases again).
-- KEYS: incarnation, its birth (server ms), live gateways (sorted set gateway -> expiry), their
-- incarnations (hash)
-- ARGV: gateway, ttl_ms, synced incarnation, fresh incarnation, '1' to start a new one
-- Answers {incarnation, its age in ms, the server's time in ms, n, the n live gateways, then
-- those synced to it}
local now = now_ms()
if ARGV[5] == '1' or not redis.call('GET', KEYS[1]) then
  redis.call('SET', KEYS[1], ARGV[4])
  redis.call('SET', KEYS[2], now)
end
local incarnation = redis.call('GET', KEYS[1])
local born = tonumber(redis.call('GET', KEYS[2]) or now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('ZREM', KEYS[3], gone)
  redis.call('HDEL', KEYS[4], gone)
end
local live = redis.call('ZRANGE', KEYS[3], 0, -1)
local answer = {incarnation, now - born, now, #live}
for _, gateway in ipairs(live) do answer[#answer + 1] = gateway end
for _, gateway in ipairs(live) do
  if redis.call('HGET', KEYS[4], gateway) == incarnation then answer[#answer + 1] = gateway end
end
return answer

--- leave
-- A gateway stopping cleanly is no longer live. KEYS: live gateways, their incarnations
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
