-- regions.lua: what the regions sharing global limits tell each other, in the global store
-- (`src/regions/`). Every replica of every region calls it once per exchange interval: once
-- to say its region is alive, and once per global key it saw asked for, with that demand.
-- Times are the global store's own (TIME), so the regions' clocks never meet.
--
-- ARGV[1] = 'beat'
--   KEYS[1]  the regions' heartbeats, a hash: region -> the ms its beat lasts until
--   ARGV[2]  this region's name, ARGV[3] how long its beat lasts (ms)
--   Returns: a flat list of the regions alive now, name then ms left.
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
-- is host and process).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if ARGV[1] == 'beat' then
  local ttl = tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], ARGV[2], now + ttl)
  local all = redis.call('HGETALL', KEYS[1])
  local out = {}
  for i = 1, #all, 2 do
    local left = tonumber(all[i + 1]) - now
    if left > 0 then
      out[#out + 1] = all[i]
      out[#out + 1] = left
    elseif left < -86400000 then
      -- A region gone a day: its entry goes (it is counted as not heard from either way).
      redis.call('HDEL', KEYS[1], all[i])
    end
  end
  return out
end

local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[1], ARGV[2] .. '|' .. ARGV[3], ARGV[4] .. '|' .. (now + ttl))
local all = redis.call('HGETALL', KEYS[1])
local totals, order = {}, {}
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  local bar = string.find(value, '|', 1, true)
  local demand, until_ms = tonumber(string.sub(value, 1, bar - 1)), tonumber(string.sub(value, bar + 1))
  if until_ms <= now then
    redis.call('HDEL', KEYS[1], field)
  else
    local region = string.sub(field, 1, string.find(field, '|', 1, true) - 1)
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
