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
-- State: KEYS[1] is a 24-byte string, three little-endian doubles packed with
-- `struct.pack('<ddd')`: the window's start (epoch ms), the hits counted in it, debt included,
-- and the limit they were counted against. It is written with one `SET … PX`, to expire when
-- the window (or its debt) ends.
-- The start is stored rather than implied by the expiry because Redis checks expiry against the
-- time the script started, while the window is computed from `TIME` inside it: at a window
-- edge the two can disagree, and comparing the start keeps the count of the old window out of
-- the new one (beyond its debt).
--
-- A limit edit keeps what was admitted and the debt (`counted` in the Rust): a count kept
-- against another limit is read as min(count, limit) plus its debt (what it holds past the
-- larger of the two limits, at most one limit). A 16-byte string (the previous release's two
-- numbers) or a hash without `l` was counted against the limit in force.
--
-- 0.1.0 kept the numbers in a hash (`w`, `c`, and now `l`; `HMGET`, `HSET`, `PEXPIRE`), which costs
-- Redis a call and two decimals more per hit. Either is read (a rolling upgrade from 0.1.0 meets
-- its hashes); which one is written is `HASH_STATE` below, set from `store_state_format` as in
-- token_bucket.lua (docs/redis.md).
--
-- Calendar windows (ARGV[5] > 0) are a day, ISO week, month or year of the civil calendar
-- at a fixed UTC offset instead (src/quota/calendar.rs, whose integer date arithmetic,
-- Hinnant's days_from_civil / civil_from_days, is copied here line for line): a month's
-- window is that month, 28 to 31 days long.
--
-- KEYS[1]  the window key
-- ARGV[1]  limit: hits allowed per window
-- ARGV[2]  window_ms: the window length, >= 1 (a calendar window's nominal length: unused)
-- ARGV[3]  cost: hits to count, 0 = check only; with mode 2 the hits given back. The caller
--          clamps a take's cost to limit + 1 (2 x limit + 1 with overdraft), which changes no
--          answer and keeps the numbers exact doubles.
-- ARGV[4]  mode: 0 = take (a hit that does not fit is refused and counts up to the limit),
--          1 = overdraft (it is charged anyway, into debt, the count capped at 2 x limit),
--          2 = give back: `cost` off this window's count, never below its debt (the count
--          past the limit: a refund gives back what was taken within the limit, never what
--          was charged beyond it), and nothing when ARGV[7] names an earlier window (a past
--          window's count is left as it is). An epoch-aligned window's give-backs go through
--          lease.lua; a calendar window is never leased, and its refunds come here.
--          3 = reserve: a take whose refusal counts nothing (a reservation that a
--          `charge_parent` settlement will settle, or, refused, nothing will).
-- ARGV[5]  calendar: 0 = windows of window_ms from the epoch, 1 day, 2 ISO week, 3 month,
--          4 year
-- ARGV[6]  the calendar's UTC offset in minutes + 1080 (never negative; 1080 is UTC)
-- ARGV[7]  a give-back's receipt: when the window its hits were taken in ends, as the replica
--          that took them reckoned it (never later than this script's own end); the give-back
--          applies only if the current window started before it. 0: no receipt (the current
--          window). Unused by the other modes.
--
-- Returns {allowed (1|0), remaining (hits left), reset_ms (until the count is back at 0: the
--          window's end, or the end of its debt), retry_ms (until a refused hit of this cost
--          could fit, with overdraft a hit of 1; 0 if allowed; -1 = never), found (a take's
--          count before its own hits, debt included: a refused take reports none remaining,
--          and statsd splits its hits as the reference does from this; a give-back answers
--          the first four only)}.

-- The take itself is `take_window` below; the last lines (after `ENTRY`) read this call's
-- arguments and clock and call it. A batch (`lua/batch.lua`, put together in
-- src/store/redis/lua.rs) takes everything above `ENTRY` once per call and calls `take_window`
-- for each fixed-window op, whose seven numbers travel packed in one argument
-- (`struct.pack('<dddBBdd')`: the same doubles `tonumber` makes of the decimals here), so a
-- batched op builds no closure and parses no decimal.

-- store_state_format: false = the packed string, true = 0.1.0's hash (see the header).
local HASH_STATE = false

local DAY = 86400000

-- Days since 1970-01-01 of a civil date, and back (src/quota/calendar.rs).
local function days_from_civil(y, m, d)
  if m <= 2 then
    y = y - 1
  end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

local function civil_from_days(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then
    y = y + 1
  end
  return y, m
end

-- The Rust's Calendar::next: the start of the calendar window after the one starting at `s`.
local function window_next(s, calendar, offset_ms)
  local d = math.floor((s + offset_ms) / DAY)
  local next_day = d + 1
  if calendar == 2 then
    next_day = d + 7
  elseif calendar == 3 then
    local y, m = civil_from_days(d)
    if m == 12 then
      next_day = days_from_civil(y + 1, 1, 1)
    else
      next_day = days_from_civil(y, m + 1, 1)
    end
  elseif calendar == 4 then
    local y = civil_from_days(d)
    next_day = days_from_civil(y + 1, 1, 1)
  end
  return math.max(next_day * DAY - offset_ms, 0)
end

-- The Rust's later(n): ms from `now_ms` until the end of the window n - 1 windows after the
-- one ending at `end_ms`.
local function later(n, now_ms, end_ms, window_ms, calendar, offset_ms)
  if calendar == 0 then
    return end_ms - now_ms + math.max(n - 1, 0) * window_ms
  end
  local e = end_ms
  for _ = 2, n do
    e = window_next(e, calendar, offset_ms)
  end
  return e - now_ms
end

-- Stores the window starting at `start_ms` with `count` hits counted against `limit`, to
-- expire in `ttl_ms`, in the
-- format this replica writes. `packed`: whether the key holds the packed format now.
local function write_window(key, start_ms, count, limit, ttl_ms, packed)
  if HASH_STATE then
    if packed then
      -- A packed state (this release's default) becomes a hash: HSET cannot write a string.
      redis.call('DEL', key)
    end
    redis.call('HSET', key, 'w', start_ms, 'c', count, 'l', limit)
    redis.call('PEXPIRE', key, ttl_ms)
  else
    redis.call('SET', key, struct.pack('<ddd', start_ms, count, limit), 'PX', ttl_ms)
  end
end

-- One hit on the window at `key` at `now_ms`; the reply as the header says. `offset_ms` is the
-- calendar's UTC offset in ms (unused for windows of window_ms); `receipt` ARGV[7].
local function take_window(key, now_ms, limit, window_ms, cost, mode, calendar, offset_ms,
    receipt)
  local overdraft = mode == 1

  -- The window holding now_ms: [start_ms, end_ms).
  local start_ms, end_ms
  if calendar == 0 then
    start_ms = now_ms - now_ms % window_ms
    end_ms = start_ms + window_ms
  else
    -- The Rust's Calendar::start.
    local days = math.floor((now_ms + offset_ms) / DAY)
    local start_day = days
    if calendar == 2 then
      start_day = days - (days + 3) % 7
    elseif calendar == 3 then
      local y, m = civil_from_days(days)
      start_day = days_from_civil(y, m, 1)
    elseif calendar == 4 then
      local y = civil_from_days(days)
      start_day = days_from_civil(y, 1, 1)
    end
    start_ms = math.max(start_day * DAY - offset_ms, 0)
    end_ms = window_next(start_ms, calendar, offset_ms)
  end

  -- The stored window, in either format. The one this replica writes is asked for first: the
  -- other answers WRONGTYPE (which Redis counts in its errorstats), so that happens once per
  -- key while the formats change over, not on every call.
  local stored_w, stored_c, stored_l
  local packed, hash
  if HASH_STATE then
    hash = redis.pcall('HMGET', key, 'w', 'c', 'l')
    if hash.err then
      hash = nil
      packed = redis.call('GET', key)
    end
  else
    packed = redis.pcall('GET', key)
    if type(packed) == 'table' then
      packed = nil
      hash = redis.call('HMGET', key, 'w', 'c', 'l')
    end
  end
  if packed then
    if #packed == 24 then
      stored_w, stored_c, stored_l = struct.unpack('<ddd', packed)
    elseif #packed == 16 then
      stored_w, stored_c = struct.unpack('<dd', packed)
    else
      return redis.error_reply('tollgate: ' .. key .. ' holds something other than a fixed window')
    end
  elseif hash and hash[1] and hash[2] then
    stored_w, stored_c, stored_l = tonumber(hash[1]), tonumber(hash[2]), tonumber(hash[3])
  end
  local before = 0
  local stored_count = stored_c
  if stored_c then
    -- counted: a count kept against another limit, in this limit's terms.
    if stored_l and stored_l ~= limit then
      local debt = math.min(math.max(stored_c - math.max(stored_l, limit), 0), limit)
      stored_c = math.min(stored_c, limit) + debt
    end
    -- Window::before: a stored count is read as at most one limit of debt (the most a window
    -- carries).
    stored_c = math.min(stored_c, 2 * limit)
  end
  if stored_w == start_ms then
    before = stored_c
  elseif stored_w and stored_w < start_ms then
    -- The Rust's Window::before: `windows` later, the windows between have paid a limit each
    -- (a calendar's counted one by one, up to one more than the count holds limits).
    local windows
    if calendar == 0 then
      windows = (start_ms - stored_w) / window_ms
    else
      local most = 1
      if limit > 0 then
        most = math.floor(stored_c / limit) + 1
      end
      windows = 0
      local at = stored_w
      while at < start_ms and windows < most do
        at = window_next(at, calendar, offset_ms)
        windows = windows + 1
      end
    end
    before = math.max(stored_c - windows * limit, 0)
  end
  local window_left = end_ms - now_ms

  if mode == 2 then
    -- The Rust's return_windows: off this window's count, never below its debt
    -- (give_back_count), and nothing for a receipt of an earlier window (receipt_is_current);
    -- another window's count is left as it is.
    if receipt > 0 and start_ms >= receipt then
      cost = 0
    end
    local count = 0
    if stored_w == start_ms then
      count = math.max(before - cost, before - limit, 0)
    elseif stored_w then
      count = before
    end
    -- The count is back at 0 once ceil(count / limit) windows have paid a limit each.
    local reset_ms = window_left
    if limit > 0 and count > limit then
      reset_ms = later(math.ceil(count / limit), now_ms, end_ms, window_ms, calendar, offset_ms)
    end
    if stored_w == start_ms then
      write_window(key, start_ms, count, limit, reset_ms, packed)
    end
    return {1, math.max(limit - count, 0), reset_ms, 0}
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
        and not (stored_w < start_ms and stored_count > limit) then
      redis.call('DEL', key)
    end
  else
    local after = before + cost
    allowed = after <= limit
    if allowed then
      count = after
    elseif overdraft then
      count = math.max(math.min(after, 2 * limit), before)
    elseif mode == 3 then
      -- A reservation that does not fit counts nothing (nothing will settle it).
      count = before
    else
      count = math.max(limit, before)
    end
  end

  local reset_ms = window_left
  if limit > 0 and count > limit then
    -- The count is back at 0 once ceil(count / limit) windows have paid a limit each.
    reset_ms = later(math.ceil(count / limit), now_ms, end_ms, window_ms, calendar, offset_ms)
  end
  if cost > 0 then
    write_window(key, start_ms, count, limit, reset_ms, packed)
  end

  -- The Rust's retry_of: until a hit of `c` fits after `count` (-1: never).
  local retry_ms = 0
  if not allowed then
    local c = 1
    if not overdraft then
      c = math.max(cost, 1)
    end
    if count + c <= limit then
      retry_ms = 0
    elseif c > limit or limit == 0 then
      retry_ms = -1
    else
      retry_ms = later(math.ceil((count + c - limit) / limit), now_ms, end_ms, window_ms,
        calendar, offset_ms)
    end
  end

  return {allowed and 1 or 0, math.max(limit - count, 0), reset_ms, retry_ms, before}
end

-- ENTRY: this call's one hit (a batch stops above this line).
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return take_window(KEYS[1], now_ms, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), tonumber(ARGV[5]), (tonumber(ARGV[6]) - 1080) * 60000, tonumber(ARGV[7]))
