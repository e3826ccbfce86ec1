-- regions.lua: what the regions sharing global limits tell each other, in the global store
-- (`src/regions/`). Every replica of every region calls it once per exchange interval: once
-- to say it is alive, and once per global key it saw asked for, with that demand. Times are
-- the global store's own (TIME), so the regions' clocks never meet.
--
-- ARGV[1] = 'beat' (or 'leave', at a graceful stop: the replica's entries go)
--   KEYS[1]  the heartbeats, a hash: '<region>|<replica>' -> the ms its beat lasts until
--   KEYS[2]  the replicas' settings, a hash: '<region>|<replica>' -> the text of the settings
--            its shares are computed from (`src/regions/agree.rs`), kept as long as its beat
--            (an earlier release passes no KEYS[2] and publishes none)
--   ARGV[2]  this region's name, ARGV[3] this replica's id, ARGV[4] how long its beat lasts
--            (ms), ARGV[5] how long an ended beat is remembered (ms), ARGV[6] its settings
--   Returns: a flat list, for every replica heard from within the memory: '<region>|<replica>',
--   the ms its beat has left (0 or less: ended, the replica is not heard from), and its
--   settings ('' when it published none).
--
-- ARGV[1] = 'demand'
--   KEYS[1]  one global key's demand, a hash: '<region>|<replica>' -> '<demand>|<until ms>'
--   ARGV[2]  this region's name, ARGV[3] this replica's id, ARGV[4] its demand (tokens asked
--            over one window of the limit, in parts per million of the limit), ARGV[5] how
--            long the entry lasts (ms)
--   Returns: a flat list of region name then its total demand (every replica's entry that
--   has not ended, summed).
--
-- Region names and replica ids never contain '|' (the settings check the names; a replica id
-- is host, process and a random number). An entry of another shape is skipped.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local field = ARGV[2] .. '|' .. ARGV[3]

if ARGV[1] == 'leave' then
  redis.call('HDEL', KEYS[1], field)
  if KEYS[2] then
    redis.call('HDEL', KEYS[2], field)
  end
  return {}
end

if ARGV[1] == 'beat' then
  local ttl, memory = tonumber(ARGV[4]), tonumber(ARGV[5])
  redis.call('HSET', KEYS[1], field, now + ttl)
  redis.call('HSET', KEYS[2], field, ARGV[6])
  local all = redis.call('HGETALL', KEYS[1])
  local out = {}
  for i = 1, #all, 2 do
    local bar = string.find(all[i], '|', 1, true)
    local left = (tonumber(all[i + 1]) or 0) - now
    if not bar or left < -memory then
      redis.call('HDEL', KEYS[1], all[i])
      redis.call('HDEL', KEYS[2], all[i])
    else
      out[#out + 1] = all[i]
      out[#out + 1] = left
      out[#out + 1] = redis.call('HGET', KEYS[2], all[i]) or ''
    end
  end
  redis.call('PEXPIRE', KEYS[1], ttl + memory)
  redis.call('PEXPIRE', KEYS[2], ttl + memory)
  return out
end

local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[1], field, ARGV[4] .. '|' .. (now + ttl))
local all = redis.call('HGETALL', KEYS[1])
local totals, order = {}, {}
for i = 1, #all, 2 do
  local name, value = all[i], all[i + 1]
  local bar = string.find(value, '|', 1, true)
  local sep = string.find(name, '|', 1, true)
  local demand = bar and tonumber(string.sub(value, 1, bar - 1))
  local until_ms = bar and tonumber(string.sub(value, bar + 1))
  if not (sep and demand and until_ms) or until_ms <= now then
    redis.call('HDEL', KEYS[1], name)
  else
    local region = string.sub(name, 1, sep - 1)
    if not totals[region] then
      totals[region] = 0
      order[#order + 1] = region
    end
    totals[region] = totals[region] + demand
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
local out = {}
for _, region in ipairs(order) do
  out[#out + 1] = region
  out[#out + 1] = totals[region]
end
return out
