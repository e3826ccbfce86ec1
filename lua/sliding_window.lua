-- sliding_window.lua: one atomic sliding-window-counter take, the Redis twin of `take_sliding`
-- in src/quota/bucket/sliding_window.rs (tests/lua_mirror.rs holds the two to the same outcomes
-- and stored state under a test clock).
--
-- Windows are epoch-aligned by Redis `TIME` (ms), as in fixed_window.lua. The script keeps the
-- count of the current window and of the one before, and estimates the hits in the last
-- window_ms as prev * (1 - elapsed / window_ms) + curr (elapsed: ms since the current window
-- started), as if the previous window's hits had been spread evenly over it. A take of `cost`
-- is allowed when estimate + max(cost, 1) <= limit and adds `cost` to the current count. Unlike
-- fixed_window.lua (and the reference), a refused take counts nothing, unless overdraft is
-- on: then it is counted anyway (until the estimate reaches twice the limit: one limit of debt). A cost of 0
-- checks without counting (allowed while at least one unit is left).
--
-- State: KEYS[1] is a hash of three fields, `w` (the current window's start, epoch ms), `p`
-- (hits allowed in the window before it) and `c` (hits allowed in it). When the stored window
-- is the previous one, its `c` becomes the previous count and the current one starts at 0; an
-- older window (or, after a clock step back, a later one) counts nothing, like fixed_window.
-- The key expires (PEXPIRE) when the estimate has decayed to 0: the end of the next window
-- while `c` > 0, the end of this one if only `p` is. A state of two zeros is a missing key, so
-- it is deleted rather than stored. The start is stored rather than implied by the expiry
-- because Redis checks expiry against the time the script started, while the window is
-- computed from `TIME` inside it. The hash is written only when the state changed (a new
-- window, or an allowed take that counts): a check or a refusal leaves the stored state and
-- its TTL as they are, which are still right.
--
-- KEYS[1]  the bucket key
-- ARGV[1]  limit: hits allowed per window-long span
-- ARGV[2]  window_ms: the window length, >= 1
-- ARGV[3]  cost: hits to count, 0 = check only. Sent unclamped as a decimal integer (up to
--          2^64-1): `tonumber` rounds it to the same double as Rust's `cost as f64`, and an
--          allowed cost is at most the limit, and a charged count is capped at 2 x limit,
--          so the stored counts stay exact.
-- ARGV[4]  mode: 0 = a take; 1 = overdraft: a take that does not fit is counted anyway (and
--          refused); 2 = give back: `cost` hits off the current window's count, never below
--          its debt (the count past the limit; a refund: Envoy's `is_negative_hits`;
--          `give_back_sliding` in the Rust), and nothing when ARGV[5] names an earlier window.
--          Never refused; the previous window's count keeps what is left of it.
-- ARGV[5]  a give-back's receipt: when the window its hits were taken in ends, as the replica
--          that took them reckoned it; the give-back applies only if the current window
--          started before it. 0: no receipt (the current window).
--
-- Returns {allowed (1|0), remaining (floor(limit - estimate after the take), >= 0),
--          reset_ms (until the estimate has decayed to 0; 0 if it is 0),
--          retry_ms (until a refused take of this cost would fit, with overdraft a take of
--                    1; >= 1; 0 if allowed; -1 = never: the cost is above the limit, or
--                    the limit is 0)}.
-- The estimate and waits are doubles computed in the same order as the Rust (multiply first,
-- divide once), so both round alike; waits are rounded up.

local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local overdraft = ARGV[4] == '1'
local give_back = ARGV[4] == '2'
local receipt = tonumber(ARGV[5])

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local start_ms = now_ms - now_ms % window_ms
local state = redis.call('HMGET', KEYS[1], 'w', 'p', 'c')
local prev, curr = 0, 0
-- Whether what is stored differs from the state this take leaves (before counting it).
local changed = false
if state[1] and state[2] and state[3] then
  local stored_start = tonumber(state[1])
  if stored_start == start_ms then
    prev = tonumber(state[2])
    curr = tonumber(state[3])
  else
    changed = true
    if stored_start + window_ms == start_ms then
      -- The stored window is the one before: its count becomes the previous count.
      prev = tonumber(state[3])
    end
  end
end

local elapsed = now_ms - start_ms
local estimate = prev * (window_ms - elapsed) / window_ms + curr
local need = math.max(cost, 1)
local allowed = limit > 0 and estimate + need <= limit
if give_back then
  allowed = true
  if receipt > 0 and start_ms >= receipt then
    cost = 0
  end
  local left = math.max(curr - cost, curr - limit, 0)
  if left ~= curr then
    changed = true
  end
  curr = left
  estimate = prev * (window_ms - elapsed) / window_ms + curr
elseif allowed then
  curr = curr + cost
  estimate = estimate + cost
  if cost > 0 then
    changed = true
  end
elseif overdraft and cost > 0 then
  -- At most one limit of debt: the estimate after the charge stays within 2 x limit.
  local room = math.max(math.floor(2 * limit - estimate), 0)
  local charged = curr + math.min(cost, room)
  estimate = estimate + (charged - curr)
  if charged ~= curr then
    changed = true
  end
  curr = charged
end

local end_ms = start_ms + window_ms - now_ms
local reset_ms = 0
if curr > 0 then
  reset_ms = end_ms + window_ms
elseif prev > 0 then
  reset_ms = end_ms
end

local retry_ms
if allowed then
  retry_ms = 0
elseif limit == 0 or (cost > limit and not overdraft) then
  retry_ms = -1
else
  -- sliding_wait: when the decaying estimate is down to `room`, the cost (with overdraft,
  -- a take of 1) fits.
  local room = limit - need
  if overdraft then
    room = limit - 1
  end
  local wait
  if prev > 0 and curr <= room then
    -- In this window: prev * (w - x) / w + curr <= room from x = w - (room - curr) * w / prev.
    wait = window_ms - (room - curr) * window_ms / prev - elapsed
  elseif curr > 0 then
    -- In the next one, where curr is the previous count: from y = w - room * w / curr.
    wait = window_ms - elapsed + (window_ms - room * window_ms / curr)
  else
    -- Unreachable for a refused take; keeps every division defined.
    wait = window_ms - elapsed
  end
  -- Never 0 for a refused take: rounding must not turn a fraction of a ms into "now".
  retry_ms = math.max(1, math.ceil(wait))
end

if prev == 0 and curr == 0 then
  -- Equal to a missing key: store nothing.
  if state[1] then
    redis.call('DEL', KEYS[1])
  end
elseif changed then
  redis.call('HSET', KEYS[1], 'w', start_ms, 'p', prev, 'c', curr)
  redis.call('PEXPIRE', KEYS[1], reset_ms)
end

return {allowed and 1 or 0, math.floor(math.max(limit - estimate, 0)), reset_ms, retry_ms}
