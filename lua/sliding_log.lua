-- sliding_log.lua: one atomic sliding-log take, the Redis twin of `take_log` in
-- src/quota/bucket/sliding_log.rs (tests/lua_mirror.rs holds the two to the same outcomes
-- and stored hits under a test clock).
--
-- Every admitted hit is a member of a sorted set scored by its time (Redis `TIME`, ms). A hit
-- at t counts while now - window_ms < t; a take of `cost` is allowed when the hits left plus
-- max(cost, 1) fit the limit, and adds `cost` members at now. A refused take records nothing;
-- a cost of 0 checks. Exact at window edges; memory grows with the hits kept (the rules cap
-- the limit at `sliding_log_max_limit`, 10,000 by default).
--
-- State: KEYS[1] is a sorted set of members `<ms>:<n>` (n counts the hits recorded at that
-- ms, so members are unique and the hits of one ms are removed together), expiring (PEXPIRE)
-- when its newest hit leaves the window. Redis deletes a set that trimming empties.
--
-- KEYS[1]  the log key
-- ARGV[1]  limit: hits allowed in any window-long span
-- ARGV[2]  window_ms: the window length, >= 1
-- ARGV[3]  cost: hits to record, 0 = check only. Sent unclamped; only a cost of at most the
--          limit is ever recorded.
--
-- Returns {allowed (1|0), remaining (hits left after the take), reset_ms (until the newest
--          hit leaves; 0 if none), retry_ms (until enough of the oldest hits have left for
--          this cost to fit, >= 1; 0 if allowed; -1 = never: the cost is above the limit,
--          or the limit is 0)}.

local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- trim: the hits at or before now - window_ms have left.
if now_ms >= window_ms then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - window_ms)
end
local count = redis.call('ZCARD', KEYS[1])
local need = math.max(cost, 1)
local allowed = limit > 0 and count + need <= limit

if allowed and cost > 0 then
  -- record: `cost` members at now, numbered after those already at this ms.
  local first = redis.call('ZCOUNT', KEYS[1], now_ms, now_ms)
  local args = {}
  for i = 0, cost - 1 do
    args[#args + 1] = now_ms
    args[#args + 1] = now_ms .. ':' .. (first + i)
    -- ZADD in batches: Lua's unpack has a limit on arguments.
    if #args >= 1000 or i == cost - 1 then
      redis.call('ZADD', KEYS[1], unpack(args))
      args = {}
    end
  end
  count = count + cost
end

local function leaves(t)
  return math.max(t + window_ms - now_ms, 0)
end

local retry_ms
if allowed then
  retry_ms = 0
elseif limit == 0 or cost > limit then
  retry_ms = -1
else
  -- The (count + need - limit)-th oldest hit must leave first.
  local kth = redis.call('ZRANGE', KEYS[1], count + need - limit - 1, count + need - limit - 1, 'WITHSCORES')
  retry_ms = math.max(leaves(tonumber(kth[2])), 1)
end

local reset_ms = 0
if count > 0 then
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  reset_ms = leaves(tonumber(newest[2]))
  redis.call('PEXPIRE', KEYS[1], math.max(reset_ms, 1))
end

return {allowed and 1 or 0, math.max(limit - count, 0), reset_ms, retry_ms}
