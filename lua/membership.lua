-- membership.lua: the fleet's live replicas, for the local fallback's share (quota ÷ replicas).
-- One sorted set under its own hash tag: member = replica id, score = when its heartbeat
-- expires, in ms on the Redis clock (TIME), so replicas never compare their own clocks.
--
-- KEYS[1]  the set, e.g. tollgate:{members}
-- ARGV[1]  this replica's id
-- ARGV[2]  how long this heartbeat keeps the replica live, in ms
-- ARGV[3]  1: leave (graceful shutdown), 0: heartbeat
--
-- Returns the number of live replicas after the change (expired entries are dropped first).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  local ttl = tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  -- The set goes away by itself once no replica heartbeats any more.
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
end
return redis.call('ZCARD', KEYS[1])
