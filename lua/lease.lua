-- lease.lua: claim a lease of tokens from a bucket, or give unspent leased tokens back; the
-- Redis twin of `claim_token` / `return_token` / `claim_window` / `return_window` in
-- src/quota/bucket/ (token_bucket.rs, fixed_window.rs) (tests/lua_mirror.rs holds the two to the same answers).
--
-- A replica that leases a hot key claims several tokens in one call and spends them from memory
-- (src/limiter/lease.rs). The tokens come out of the very state token_bucket.lua and
-- fixed_window.lua keep (same key, same format, same expiry rule), so a leased, an unleased and
-- a returned token are all one accounting. The clock is Redis `TIME` (ms).
--
-- A claim grants all of `need` and up to `want` tokens, or nothing (no partial admits): with
-- `available` tokens in the bucket (a token bucket's refilled tokens, a fixed window's
-- limit - count), it is refused when available < need, else it grants
--   need + min(want - need, floor((available - need) / share))
-- so a nearly spent bucket is split between `share` replicas instead of hoarded by one. A
-- refused claim changes nothing (unlike a fixed-window take, it is not counted).
-- A give-back adds `need` tokens to a token bucket (capped at the capacity), or takes `need`
-- hits off a fixed window's count if that window is still the current one (and, for a refund
-- with a receipt, the one the receipt names). A fixed window's count past its limit is debt
-- (charged usage), carried into the next windows as fixed_window.lua carries it: claims see
-- it, and a give-back never pays it (a count stays past its limit by as much; a token
-- bucket's balance below zero is debt the same way: it rises to at most capacity + balance).
--
-- KEYS[1]  the bucket key
-- ARGV[1]  algorithm: 1 = token bucket, 2 = fixed window
-- ARGV[2]  action: 1 = claim, 2 = give back
-- ARGV[3]  capacity (token bucket: the burst) or limit (fixed window: hits per window)
-- ARGV[4]  refill: tokens added per window (token bucket; 0 for a fixed window)
-- ARGV[5]  window_ms, >= 1
-- ARGV[6]  need: claim: tokens that must all be granted (>= 1); give back: tokens returned
-- ARGV[7]  want: most tokens a claim takes (>= need). A give-back: its receipt (0: none). On
--          a fixed window, when the window its tokens were taken in ends as the replica that
--          took them reckoned it (nothing is given back once the current window started at
--          or after it); on a token bucket, when they were taken (what the refill gave since
--          is taken off the give-back: refund_after_refill in token_bucket.rs)
-- ARGV[8]  share: the extra beyond `need` is split this many ways (>= 1; live replicas)
--
-- Returns {granted (0 = refused or a give-back), remaining (whole tokens left in the shared
--          bucket, floored), reset_ms (until full again / until the window's count is back
--          at 0: its end, or with debt the end of the window that pays its last part),
--          retry_ms (until `need` would fit; 0 if granted; -1 = never)}.

local algorithm = tonumber(ARGV[1])
local action = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local refill = tonumber(ARGV[4])
local window_ms = tonumber(ARGV[5])
local need = tonumber(ARGV[6])
local want = tonumber(ARGV[7])
local share = math.max(tonumber(ARGV[8]), 1)

-- store_state_format, as in token_bucket.lua: false = the packed string, true = 0.1.0's hash.
local HASH_STATE = false

local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local MAX_INT = 9007199254740992 -- 2^53

-- ClaimAsk::grant: what `available` (>= need) tokens grant.
local function grant(available)
  local spare = math.floor((available - need) / share)
  return need + math.min(math.max(want - need, 0), math.max(spare, 0))
end

-- The key's three stored numbers, in either format (as token_bucket.lua and fixed_window.lua
-- read them): the packed string's doubles, or 0.1.0's hash fields `f1`, `f2` and `f3` (the
-- capacity or limit the state counts against, which 0.1.0's hashes lack). A packed string of
-- two doubles (the previous release's) has no third either. The one this replica writes is
-- asked for first: the other answers WRONGTYPE (which Redis counts in its errorstats), so that
-- happens once per key while the formats change over, not on every call. Returns the numbers
-- (nil: no state; the third nil when not stored) and whether the key holds the packed format;
-- or, for a string of another length, nil, nil, nil, nil and an error reply.
local function read_state(f1, f2, f3, what)
  local packed, hash
  if HASH_STATE then
    hash = redis.pcall('HMGET', KEYS[1], f1, f2, f3)
    if hash.err then
      hash = nil
      packed = redis.call('GET', KEYS[1])
    end
  else
    packed = redis.pcall('GET', KEYS[1])
    if type(packed) == 'table' then
      packed = nil
      hash = redis.call('HMGET', KEYS[1], f1, f2, f3)
    end
  end
  if packed then
    if #packed == 24 then
      local a, b, c = struct.unpack('<ddd', packed)
      return a, b, c, true
    elseif #packed == 16 then
      local a, b = struct.unpack('<dd', packed)
      return a, b, nil, true
    end
    return nil, nil, nil, nil,
      redis.error_reply('tollgate: ' .. KEYS[1] .. ' holds something other than ' .. what)
  elseif hash and hash[1] and hash[2] then
    return tonumber(hash[1]), tonumber(hash[2]), tonumber(hash[3]), false
  end
  return nil, nil, nil, false
end

-- Stores the numbers `a`, `b` and `c` (0.1.0's hash fields `f1`, `f2`, and `f3`) to expire in
-- `ttl_ms`, in the format this replica writes. `packed`: whether the key holds the packed
-- format now.
local function write_state(f1, a, f2, b, f3, c, ttl_ms, packed)
  if HASH_STATE then
    if packed then
      -- A packed state (this release's default) becomes a hash: HSET cannot write a string.
      redis.call('DEL', KEYS[1])
    end
    redis.call('HSET', KEYS[1], f1, a, f2, b, f3, c)
    redis.call('PEXPIRE', KEYS[1], ttl_ms)
  else
    redis.call('SET', KEYS[1], struct.pack('<ddd', a, b, c), 'PX', ttl_ms)
  end
end

if algorithm == 1 then
  -- Token bucket: as token_bucket.lua (same refill arithmetic, same storage rule).
  local function refilled(elapsed_ms)
    return elapsed_ms * refill / window_ms
  end
  -- As token_bucket.lua's wait_ms (TokenBucketParams::wait_ms): stepped on until the sum is
  -- there, for large numbers.
  local EPSILON = 2.220446049250313e-16 -- 2^-52
  local function wait_ms(tokens, target)
    if tokens >= target then
      return 0
    end
    if refill <= 0 then
      return nil
    end
    local ms = math.ceil((target - tokens) * window_ms / refill)
    if tokens + refilled(ms) < target then
      -- Short (rare: large numbers). The ulp that matters is the larger number's: the
      -- target's, or a debt's (a charge). As the Rust: four checks in all (the one above
      -- included), and a fourth step taken unchecked.
      local scale = math.max(target, math.abs(tokens))
      local step = math.max(math.ceil(scale * EPSILON * window_ms / refill), 1)
      for i = 1, 4 do
        ms = ms + step
        if i == 4 or tokens + refilled(ms) >= target then
          break
        end
      end
    end
    return math.min(ms, MAX_INT)
  end

  local stored_tokens, stored_ts, stored_capacity, packed, bad =
    read_state('t', 'ts', 'c', 'a token bucket')
  if bad then
    return bad
  end
  local stored = stored_tokens ~= nil
  local tokens, last_ms
  if stored then
    last_ms = stored_ts
    -- As token_bucket.lua: a capacity edit keeps what was spent.
    if stored_capacity and stored_capacity ~= capacity then
      stored_tokens = math.max(stored_tokens + (capacity - stored_capacity), -capacity)
    end
    local elapsed = now_ms - last_ms
    if elapsed < 0 then
      elapsed = 0
    end
    tokens = math.min(capacity, stored_tokens + refilled(elapsed))
  else
    last_ms = now_ms
    tokens = capacity
  end

  local granted = 0
  local retry_ms = 0
  if action == 1 then
    need = math.max(need, 1)
    if capacity > 0 and tokens >= need then
      granted = grant(tokens)
      tokens = tokens - granted
    elseif need > capacity then
      retry_ms = -1
    else
      retry_ms = wait_ms(tokens, need) or -1
    end
  else
    -- refund_after_refill: a refund's receipt (ARGV[7], when its tokens were taken) takes off
    -- what the refill gave since; then give_back_tokens: never above the capacity, never
    -- paying debt.
    local give = need
    if want > 0 then
      give = math.max(need - math.max(now_ms - want, 0) * refill / window_ms, 0)
    end
    tokens = math.min(tokens + give, capacity + math.min(tokens, 0))
  end

  local reset_ms = wait_ms(tokens, capacity) or window_ms
  if tokens >= capacity then
    if stored then
      redis.call('DEL', KEYS[1])
    end
  else
    local ts = math.max(now_ms, last_ms)
    write_state('t', tokens, 'ts', ts, 'c', capacity, math.max(reset_ms, 1), packed)
  end
  return {granted, math.floor(math.max(tokens, 0)), reset_ms, retry_ms}
end

-- Fixed window: as fixed_window.lua (epoch-aligned on TIME, the window's start stored with its
-- count, in either format; a count past the limit is debt, carried into the next windows, one
-- limit paid per window).
local limit = capacity
local start_ms = now_ms - now_ms % window_ms
local stored_w, stored_c, stored_l, packed, bad = read_state('w', 'c', 'l', 'a fixed window')
if bad then
  return bad
end
local current = stored_w == start_ms
local before = 0
if stored_c then
  -- As fixed_window.lua: a count kept against another limit in this one's terms, and read as
  -- at most one limit of debt.
  if stored_l and stored_l ~= limit then
    local debt = math.min(math.max(stored_c - math.max(stored_l, limit), 0), limit)
    stored_c = math.min(stored_c, limit) + debt
  end
  stored_c = math.min(stored_c, 2 * limit)
end
if current then
  before = stored_c
elseif stored_w and stored_w < start_ms then
  local windows = (start_ms - stored_w) / window_ms
  before = math.max(stored_c - windows * limit, 0)
end
local function write_window(count, ttl_ms)
  write_state('w', start_ms, 'c', count, 'l', limit, ttl_ms, packed)
end
local window_left = start_ms + window_ms - now_ms
-- fixed_window.rs's reset_of: until the count is back at 0.
local function reset_of(count)
  if limit > 0 and count > limit then
    return window_left + (math.ceil(count / limit) - 1) * window_ms
  end
  return window_left
end

if action ~= 1 then
  -- A give-back: off this window's count (never below 0; a count past the limit stays past
  -- it by what others charged). Tokens of another window are gone with it.
  local count = before
  if want > 0 and start_ms >= want then
    -- The receipt names an earlier window: its tokens are gone with it.
    current = false
  end
  if current then
    count = math.max(before - need, before - limit, 0)
    write_window(count, reset_of(count))
  end
  return {0, math.max(limit - count, 0), reset_of(count), 0}
end

need = math.max(need, 1)
local available = math.max(limit - before, 0)
if need <= available then
  local granted = grant(available)
  local count = before + granted
  write_window(count, reset_of(count))
  return {granted, math.max(limit - count, 0), reset_of(count), 0}
end
-- Refused: until `need` fits, windows paying the debt a limit each (retry_of).
local retry_ms = -1
if need <= limit and limit > 0 then
  retry_ms = window_left + (math.ceil((before + need - limit) / limit) - 1) * window_ms
end
return {0, available, reset_of(before), retry_ms}
