-- batch.lua: several bucket ops in one script call, each exactly as its own script would run
-- it alone, in order. The Redis client sends one when decisions queue for a busy node
-- (`src/store/redis/batch.rs`): one EVALSHA instead of one per op saves Redis the per-call
-- work (parsing, the script's setup, the reply) and reads `TIME` once for all of them.
--
-- This file is the dispatcher. Before it, `src/store/redis/lua.rs` defines
-- `batch_time` (one `TIME`) and `SCRIPTS[n]`: each algorithm script of `lua/`, unchanged but
-- for where it reads, wrapped as `function(KEY, B) … end`: its `TIME` reads `batch_time`, its
-- `KEYS[1]` is `KEY` (its op's key, passed in) and its `ARGV[n]` this call's `ARGV[B + n]`, so
-- an op runs on the call's own arrays and no table is built for it:
--   1 token_bucket.lua, 2 fixed_window.lua, 3 sliding_window.lua, 4 sliding_log.lua,
--   5 lease.lua.
--
-- Two layouts, told apart by ARGV[1] (a script number is never negative):
--
-- Standalone Redis (and Sentinel): every op's key declared.
--   KEYS[i]  the key of op i (every script takes one key)
--   ARGV     for each op in order: its script's number, then that script's own ARGV
--            (`NARGS[n]` of them; see each script's header)
--
-- Redis Cluster, one node's ops from different hash slots. A cluster refuses a call whose
-- declared keys hash to different slots (CROSSSLOT), but lets a script without flags touch
-- keys of other slots that the same node serves; a key it does not serve (a stale slot map)
-- fails that op alone ("non local key"), and the client sends it again by itself.
--   KEYS[1]       op 1's key: the client routes the call by it, and follows MOVED with it
--   ARGV[1]       minus the number of ops, n
--   ARGV[2 .. n]  the keys of ops 2 .. n
--   ARGV[n + 1 …] the ops as in the first layout
--
local NARGS = {5, 6, 4, 3, 8}

local out = {}
local n, keys, at = #KEYS, KEYS, 1
local first = tonumber(ARGV[1])
if first < 0 then
  n, keys, at = -first, ARGV, -first + 1
end
for i = 1, n do
  local script = tonumber(ARGV[at])
  local key = KEYS[1]
  if i > 1 then
    key = keys[i]
  end
  local ok, reply = pcall(SCRIPTS[script], key, at)
  at = at + NARGS[script] + 1
  if ok then
    out[i] = reply
  elseif type(reply) == 'table' and reply.err then
    -- Redis 7 raises a command's error as a table: kept, so the client classifies it
    -- (OOM, WRONGTYPE, …) as it would the script's own error.
    out[i] = reply
  else
    out[i] = {err = tostring(reply)}
  end
end
return out
