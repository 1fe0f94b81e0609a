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

-- {status, n, then every lease id in the set}: a gateway learns who holds what
local function holders(status, n, key)
  local answer = {status, n}
  for _, lease in ipairs(redis.call('ZRANGE', key, 0, -1)) do answer[#answer + 1] = lease end
  return answer
end

--- acquire
-- KEYS: incarnation, epochs (hash gateway -> epoch), the instance's set
-- ARGV: incarnation, gateway, epoch, lease, capacity, ttl_ms
-- Answers {status, 0, then the set's lease ids after it}.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-2, 0} end
local registered = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if registered > tonumber(ARGV[3]) then return {-3, 0} end
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local expiry = now + tonumber(ARGV[6])
if redis.call('ZSCORE', KEYS[3], ARGV[4]) then  -- a retried acquire that had landed
  redis.call('ZADD', KEYS[3], expiry, ARGV[4])
  return holders(1, 0, KEYS[3])
end
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[5]) then return holders(0, 0, KEYS[3]) end
redis.call('ZADD', KEYS[3], expiry, ARGV[4])
return holders(1, 0, KEYS[3])

--- renew
-- Extend (or register again: after a re-sync, or one whose renewal came late) the caller's own
-- leases on one instance; with no lease it only looks. Registers the caller's epoch.
-- Answers {status, leases added (were not in the set), then the set's lease ids}.
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
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local added = 0
for i = 5, #ARGV do
  added = added + redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[i])
end
return holders(1, added, KEYS[3])

--- release
-- Idempotent: 1 the first time, 0 afterwards (or for a lease already expired).
-- KEYS: the instance's set; ARGV: lease
return redis.call('ZREM', KEYS[1], ARGV[1])

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
