-- token_bucket.lua: one atomic token-bucket take, the Redis twin of `take_token` in
-- src/quota/bucket/token_bucket.rs (tests/lua_mirror.rs holds the two to the same answers).
--
-- A bucket holds up to `capacity` tokens and refills continuously at `refill` tokens per
-- `window_ms`; a take of `cost` succeeds when that many tokens are there and removes them; a
-- refused take removes nothing (with overdraft it is charged anyway, the balance going below
-- zero, at most to -capacity); a cost of 0 checks without consuming (allowed while at least
-- one token is left). The clock is Redis `TIME` (ms), so every replica sees one clock.
--
-- State: KEYS[1] is a 24-byte string, three little-endian doubles packed with
-- `struct.pack('<ddd')`: the tokens (at full precision), the ms when they were last brought up
-- to date (`ts`) and the capacity they were counted against. It is written with one
-- `SET … PX`, to expire when the bucket would be full again: a missing key *is* a full bucket,
-- so a full bucket is deleted rather than stored (as the memory store sweeps it). So `ts`
-- survives a clock step back only while the bucket is partly drained, which is where it
-- matters: a full bucket cannot refill twice.
--
-- A capacity edit keeps what was spent (TokenBucketState::capacity, `carried` in the Rust): a
-- state counted against another capacity holds `capacity - spent`, at most one capacity of
-- debt. A 16-byte string (the previous release's two numbers) or a hash without `c` was
-- counted against the capacity in force.
--
-- 0.1.0 kept the numbers in a hash (`t`, `ts`, and now `c`; `HMGET`, `HSET`, `PEXPIRE`), which costs
-- Redis ~25 % more per take. Either is read (a rolling upgrade from 0.1.0 meets its hashes);
-- which one is written is `HASH_STATE` below, which the Redis store sets from
-- `store_state_format` when it loads the script: `hash` writes what 0.1.0 reads, for the length
-- of a rolling upgrade or rollback with 0.1.0 replicas beside this one (docs/redis.md).
--
-- KEYS[1]  the bucket key
-- ARGV[1]  capacity: whole tokens (the burst)
-- ARGV[2]  refill: tokens added per window
-- ARGV[3]  window_ms: the refill window, >= 1
-- ARGV[4]  cost: tokens to take, 0 = check only. Sent unclamped as a decimal integer (up to
--          2^64-1): `tonumber` rounds it to the same double as Rust's `cost as f64`, so the
--          comparisons below see exactly the numbers the Rust does.
-- ARGV[5]  overdraft: 1 = a take that does not fit is charged anyway (and refused), 0 = not.
--
-- Returns {allowed (1|0), remaining (whole tokens, floored), reset_ms (until full again),
--          retry_ms (until a take of this cost would fit, with overdraft a take of 1; 0 if
--          allowed; -1 = never)}.
-- Integers sent back are floored/ceiled deliberately; waits are capped at 2^53 ms (~285,000
-- years, where the Rust saturates at 2^64) so Redis's double-to-integer conversion stays defined.
--
-- The take itself is `take_token` below; the last lines (after `ENTRY`) read this call's
-- arguments and clock and call it. A batch (`lua/batch.lua`, put together in src/store/redis/lua.rs)
-- takes everything above `ENTRY` once per call and calls `take_token` for each of its
-- token-bucket ops, whose five numbers travel packed in one argument (`struct.pack('<ddddB')`:
-- the same doubles `tonumber` makes of the decimals here), so a batched op builds no closure
-- and parses no decimal.

-- store_state_format: false = the packed string, true = 0.1.0's hash (see the header).
local HASH_STATE = false

local MAX_INT = 9007199254740992 -- 2^53
local EPSILON = 2.220446049250313e-16 -- 2^-52, Rust's f64::EPSILON

-- TokenBucketParams::wait_ms: ms until `tokens` become `target` as this arithmetic sees it,
-- rounded up; nil if nothing refills. The refill in `elapsed_ms` is `elapsed_ms * refill /
-- window_ms` (TokenBucketParams::refilled: multiply first, divide once, in the same order as
-- the Rust, so both round alike). The quotient can land one ulp short when the numbers are
-- large: step on by the time one ulp of `target` takes to refill (at most four steps).
local function wait_ms(tokens, target, refill, window_ms)
  if tokens >= target then
    return 0
  end
  if refill <= 0 then
    return nil
  end
  local ms = math.ceil((target - tokens) * window_ms / refill)
  if tokens + ms * refill / window_ms < target then
    -- Short (rare: large numbers). The ulp that matters is the larger number's: the
    -- target's, or a debt's (overdraft). As the Rust: four checks in all (the one above
    -- included), and a fourth step taken unchecked.
    local scale = math.max(target, math.abs(tokens))
    local step = math.max(math.ceil(scale * EPSILON * window_ms / refill), 1)
    for i = 1, 4 do
      ms = ms + step
      if i == 4 or tokens + ms * refill / window_ms >= target then
        break
      end
    end
  end
  return math.min(ms, MAX_INT)
end

-- One take on the bucket at `key` at `now_ms`; the reply as the header says.
local function take_token(key, now_ms, capacity, refill, window_ms, cost, overdraft)
  -- The stored state, in either format. The one this replica writes is asked for first: the
  -- other answers WRONGTYPE (which Redis counts in its errorstats), so that happens once per
  -- key while the formats change over, not on every call.
  local stored_tokens, stored_ts, stored_capacity
  local packed, hash
  if HASH_STATE then
    hash = redis.pcall('HMGET', key, 't', 'ts', 'c')
    if hash.err then
      hash = nil
      packed = redis.call('GET', key)
    end
  else
    packed = redis.pcall('GET', key)
    if type(packed) == 'table' then
      packed = nil
      hash = redis.call('HMGET', key, 't', 'ts', 'c')
    end
  end
  if packed then
    if #packed == 24 then
      stored_tokens, stored_ts, stored_capacity = struct.unpack('<ddd', packed)
    elseif #packed == 16 then
      stored_tokens, stored_ts = struct.unpack('<dd', packed)
    else
      return redis.error_reply('tollgate: ' .. key .. ' holds something other than a token bucket')
    end
  elseif hash and hash[1] and hash[2] then
    stored_tokens, stored_ts, stored_capacity = tonumber(hash[1]), tonumber(hash[2]), tonumber(hash[3])
  end
  local stored = stored_tokens ~= nil
  local tokens, last_ms
  if stored then
    last_ms = stored_ts
    -- carried: what was spent against the capacity in force, at most one capacity of debt.
    if stored_capacity and stored_capacity ~= capacity then
      stored_tokens = math.max(stored_tokens + (capacity - stored_capacity), -capacity)
    end
    -- saturating_sub: a clock that stepped back refills nothing.
    local elapsed = now_ms - last_ms
    if elapsed < 0 then
      elapsed = 0
    end
    tokens = math.min(capacity, stored_tokens + elapsed * refill / window_ms)
  else
    last_ms = now_ms
    tokens = capacity
  end

  local need = math.max(cost, 1)
  local allowed = capacity > 0 and tokens >= need
  if allowed then
    tokens = tokens - cost
  elseif overdraft then
    tokens = math.max(tokens - cost, -capacity)
  end

  local retry_ms
  if allowed then
    retry_ms = 0
  elseif overdraft then
    if capacity == 0 then
      retry_ms = -1
    else
      retry_ms = wait_ms(tokens, 1, refill, window_ms) or -1
    end
  elseif cost > capacity then
    retry_ms = -1
  else
    retry_ms = wait_ms(tokens, need, refill, window_ms) or -1
  end

  -- A bucket that never refills is reported to reset at its window, like the reference.
  local reset_ms = wait_ms(tokens, capacity, refill, window_ms) or window_ms

  if tokens >= capacity then
    -- Full: identical to a missing key, so store nothing.
    if stored then
      redis.call('DEL', key)
    end
  else
    -- A clock that steps back (a failover to a skewed host) must not refill twice later.
    local ts = math.max(now_ms, last_ms)
    -- token_idle_after_ms: the state stops mattering once the bucket is full again.
    local ttl_ms = math.max(reset_ms, 1)
    if HASH_STATE then
      if packed then
        -- A packed state (this release's default) becomes a hash: HSET cannot write a string.
        redis.call('DEL', key)
      end
      redis.call('HSET', key, 't', tokens, 'ts', ts, 'c', capacity)
      redis.call('PEXPIRE', key, ttl_ms)
    else
      redis.call('SET', key, struct.pack('<ddd', tokens, ts, capacity), 'PX', ttl_ms)
    end
  end

  return {allowed and 1 or 0, math.floor(math.max(tokens, 0)), reset_ms, retry_ms}
end

-- ENTRY: this call's one take (a batch stops above this line).
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return take_token(KEYS[1], now_ms, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), ARGV[5] == '1')
