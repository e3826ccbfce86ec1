-- fixed_window.lua: one atomic fixed-window hit, the Redis twin of `take_window` in
-- src/quota/bucket/fixed_window.rs (tests/lua_mirror.rs holds the two to the same answers).
--
-- Windows are epoch-aligned by Redis `TIME` (ms): every replica and the reference
-- (envoyproxy/ratelimit) agree on where a window starts. Like the reference, every hit is
-- counted, refused ones too, and a hit is over when the count passes the limit; a cost of 0
-- checks without counting (allowed while the count is below the limit). With overdraft the
-- count past the limit is debt the next windows pay, one limit each, so the key lives until
-- it is paid (`reset_ms`), and the count is capped at twice the limit.
--
-- State: KEYS[1] is a hash of two fields, `w` (the window's start, epoch ms) and `c` (hits
-- counted in it), expiring (PEXPIRE) when the window ends. The start is
-- stored rather than implied by the expiry because Redis checks expiry against the time the
-- script started, while the window is computed from `TIME` inside it: at a window edge the two
-- can disagree, and comparing `w` keeps the count of the old window out of the new one.
--
-- KEYS[1]  the window key
-- ARGV[1]  limit: hits allowed per window
-- ARGV[2]  window_ms: the window length, >= 1
-- ARGV[3]  cost: hits to count, 0 = check only. The caller clamps it to limit + 1 and this
--          script caps the stored count at limit + 1: once a window is over the limit every
--          later answer in it is the same (refused, remaining 0) whatever the exact count, so
--          the answers equal the unclamped ones while the numbers stay exact doubles. With
--          overdraft the debt matters: clamped to 2 x limit + 1, capped at 2 x limit.
-- ARGV[4]  overdraft: 1 = carry the count past the limit into the next windows, 0 = not.
--
-- Returns {allowed (1|0), remaining (hits left), reset_ms (until the window ends; with
--          overdraft debt, until the count is paid back to 0), retry_ms (until a refused hit
--          of this cost could fit, with overdraft a hit of 1; 0 if allowed; -1 = never)}.

local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local overdraft = ARGV[4] == '1'

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local start_ms = now_ms - now_ms % window_ms
local state = redis.call('HMGET', KEYS[1], 'w', 'c')
local before = 0
if state[1] and state[2] and tonumber(state[1]) == start_ms then
  before = tonumber(state[2])
elseif overdraft and state[1] and state[2] and tonumber(state[1]) < start_ms then
  -- window_with_debt: `windows` later, the windows between have paid a limit each.
  local windows = (start_ms - tonumber(state[1])) / window_ms
  before = math.max(tonumber(state[2]) - windows * limit, 0)
end
local window_left = start_ms + window_ms - now_ms
local most = limit + 1
if overdraft then
  most = 2 * limit
end

local count, allowed
if cost == 0 then
  count = before
  allowed = before < limit
  -- The Rust stores {start_ms, 0} here when the stored window is another one; a missing key
  -- means the same (0 in every window). Only a clock that stepped back can meet such a key
  -- (a past window's key has expired): then it must not count in the window it returns to.
  -- An earlier window's debt (overdraft) stays as it is: what is left of it follows from time.
  if state[1] and tonumber(state[1]) ~= start_ms
      and not (overdraft and tonumber(state[1]) < start_ms) then
    redis.call('DEL', KEYS[1])
  end
else
  local after = before + cost
  allowed = after <= limit
  count = math.min(after, most)
end

-- The Rust's later(n): the end of the window n - 1 windows after this one.
local function later(n)
  return window_left + math.max(n - 1, 0) * window_ms
end
local reset_ms = window_left
if overdraft and limit > 0 and count > limit then
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
elseif limit == 0 then
  retry_ms = -1
elseif overdraft then
  -- The first window with room: floor(count / limit) windows on.
  retry_ms = later(math.floor(count / limit))
elseif cost > limit then
  retry_ms = -1
else
  retry_ms = window_left
end

return {allowed and 1 or 0, math.max(limit - count, 0), reset_ms, retry_ms}
