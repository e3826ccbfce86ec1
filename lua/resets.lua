-- resets.lua: the fleet's log of counter resets (the admin port's counter API), so every
-- replica forgets what it holds of a reset bucket: its over-limit cache entry (which would
-- refuse the tenant until the old wait ends) and its lease (tokens claimed from the old
-- bucket). Both keys share the membership set's hash tag, so one script reaches them on a
-- cluster.
--
-- KEYS[1]  the log's sequence number (a string counter), e.g. tollgate:{members}:reset-seq
-- KEYS[2]  the log: a list of "<seq> <bucket key>", the newest last, at most 1000 entries
-- ARGV[1]  'append' or 'read'
-- append:  ARGV[2..]  the bucket keys reset. Returns the new sequence number.
-- read:    ARGV[2]    the last sequence number this replica has seen, or -1 for none yet
--          (a replica's first look: it holds nothing of earlier resets).
--          Returns {the current sequence number, complete (1|0), the keys of the entries
--          after ARGV[2]...} (with -1, the number alone). complete = 0 when entries after
--          ARGV[2] may be gone: trimmed (more than 1000 keys reset since), or the log lost
--          (flushed: its number below ARGV[2]); the reader then forgets everything it caches.
local MAX = 1000
if ARGV[1] == 'append' then
  local seq = redis.call('INCR', KEYS[1])
  for i = 2, #ARGV do
    redis.call('RPUSH', KEYS[2], seq .. ' ' .. ARGV[i])
  end
  redis.call('LTRIM', KEYS[2], -MAX, -1)
  return seq
end
local seq = tonumber(redis.call('GET', KEYS[1]) or '0')
local after = tonumber(ARGV[2])
if after < 0 then
  return {seq}
end
local complete = 1
if seq < after then
  after = 0
  complete = 0
end
local out = {seq, complete}
if seq > after then
  local entries = redis.call('LRANGE', KEYS[2], 0, -1)
  for i, entry in ipairs(entries) do
    local space = string.find(entry, ' ', 1, true)
    local n = space and tonumber(string.sub(entry, 1, space - 1))
    -- A full list was trimmed: entries after `after` may be gone unless it still starts at or
    -- before `after`.
    if i == 1 and #entries >= MAX and (not n or n > after) then
      out[2] = 0
    end
    if n and n > after then
      out[#out + 1] = string.sub(entry, space + 1)
    end
  end
end
return out
