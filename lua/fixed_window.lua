-- fixed_window.lua: one atomic fixed-window hit, the Redis twin of `take_window` in
-- src/quota/bucket/fixed_window.rs (tests/lua_mirror.rs holds the two to the same answers).
--
-- Windows are epoch-aligned by Redis `TIME` (ms): every replica and the reference
-- (envoyproxy/ratelimit) agree on where a window starts. Like the reference, a refused hit is
-- counted and a hit is over when the count passes the limit; a cost of 0 checks without
-- counting (allowed while the count is below the limit). A refused hit counts up to the limit
-- and no further (the answers are the reference's, whose counter runs on), so a count past
-- the limit is always debt: hits charged after the fact (overdraft, RLQS usage beyond an
-- assignment). Debt is carried into the next windows, which pay one limit each, whatever the
-- operation; the key lives until it is paid (`reset_ms`).
--
-- State: KEYS[1] is a hash of two fields, `w` (the window's start, epoch ms) and `c` (hits
-- counted in it, debt included), expiring (PEXPIRE) when the window (or its debt) ends. The
-- start is stored rather than implied by the expiry because Redis checks expiry against the
-- time the script started, while the window is computed from `TIME` inside it: at a window
-- edge the two can disagree, and comparing `w` keeps the count of the old window out of the
-- new one (beyond its debt).
--
-- KEYS[1]  the window key
-- ARGV[1]  limit: hits allowed per window
-- ARGV[2]  window_ms: the window length, >= 1
-- ARGV[3]  cost: hits to count, 0 = check only. The caller clamps it to limit + 1 (2 x limit
--          + 1 with overdraft), which changes no answer and keeps the numbers exact doubles.
-- ARGV[4]  overdraft: 1 = a hit that does not fit is charged anyway (into debt, the count
--          capped at 2 x limit), 0 = it is refused and counts up to the limit.
--
-- Returns {allowed (1|0), remaining (hits left), reset_ms (until the count is back at 0: the
--          window's end, or the end of its debt), retry_ms (until a refused hit of this cost
--          could fit, with overdraft a hit of 1; 0 if allowed; -1 = never)}.

local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local overdraft = ARGV[4] == '1'

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local start_ms = now_ms - now_ms % window_ms
local state = redis.call('HMGET', KEYS[1], 'w', 'c')
local stored_w = state[1] and state[2] and tonumber(state[1])
local before = 0
if stored_w == start_ms then
  before = tonumber(state[2])
elseif stored_w and stored_w < start_ms then
  -- window_at: `windows` later, the windows between have paid a limit each.
  local windows = (start_ms - stored_w) / window_ms
  before = math.max(tonumber(state[2]) - windows * limit, 0)
end
local window_left = start_ms + window_ms - now_ms

-- The Rust's later(n): the end of the window n - 1 windows after this one.
local function later(n)
  return window_left + math.max(n - 1, 0) * window_ms
end
-- The Rust's retry_of: until a hit of `c` fits after `n` (false: never).
local function retry_of(n, c)
  if n + c <= limit then
    return 0
  end
  if c > limit or limit == 0 then
    return false
  end
  return later(math.ceil((n + c - limit) / limit))
end

local count, allowed
if cost == 0 then
  count = before
  allowed = before < limit
  -- The Rust stores {start_ms, 0} here when the stored window is another one; a missing key
  -- means the same (0 in every window). A clock that steps back must not find that window's
  -- count in the window it returns to. An earlier window's debt stays as it is: what is left
  -- of it follows from time.
  if stored_w and stored_w ~= start_ms
      and not (stored_w < start_ms and tonumber(state[2]) > limit) then
    redis.call('DEL', KEYS[1])
  end
else
  local after = before + cost
  allowed = after <= limit
  if allowed then
    count = after
  elseif overdraft then
    count = math.max(math.min(after, 2 * limit), before)
  else
    count = math.max(limit, before)
  end
end

local reset_ms = window_left
if limit > 0 and count > limit then
  -- The count is back at 0 once ceil(count / limit) windows have paid a limit each.
  reset_ms = later(math.ceil(count / limit))
end
if cost > 0 then
  redis.call('HSET', KEYS[1], 'w', start_ms, 'c', count)
  redis.call('PEXPIRE', KEYS[1], reset_ms)
end

local retry_ms
if allowed then
  retry_ms = 0
elseif overdraft then
  retry_ms = retry_of(count, 1)
else
  retry_ms = retry_of(count, math.max(cost, 1))
end
if retry_ms == false then
  retry_ms = -1
end

return {allowed and 1 or 0, math.max(limit - count, 0), reset_ms, retry_ms}
