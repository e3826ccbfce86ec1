-- batch.lua: several bucket ops in one script call, each exactly as its own script would run
-- it alone, in order. The Redis client sends one when decisions queue for a busy node
-- (`src/store/redis/batch.rs`): one EVALSHA instead of one per op saves Redis the per-call
-- work (parsing, the script's setup, the reply) and reads `TIME` once for all of them.
--
-- This file is the dispatcher. Before it, `src/store/redis/lua.rs` defines
-- `batch_time` (one `TIME`) and `SCRIPTS[n]`: each algorithm script of `lua/`, unchanged but
-- for where it reads, wrapped as `function(K, B) … end`: its `TIME` reads `batch_time`, its
-- `KEYS[1]` reads this call's `KEYS[K]` and its `ARGV[n]` this call's `ARGV[B + n]`, so an op
-- runs on the call's own arrays and no table is built for it:
--   1 token_bucket.lua, 2 fixed_window.lua, 3 sliding_window.lua, 4 sliding_log.lua,
--   5 lease.lua.
--
-- KEYS[i]  the key of op i (every script takes one key)
-- ARGV     for each op in order: its script's number, then that script's own ARGV
--          (`NARGS[n]` of them; see each script's header)
--
-- Returns one reply per op: the script's own, or the error it raised as an error reply in
-- its place, so one op's error (a WRONGTYPE key, say) neither fails the others nor hides
-- what they spent. The ops before it ran and stay run, as they would have alone.

local NARGS = {5, 6, 4, 3, 8}

local out = {}
local at = 1
for i = 1, #KEYS do
  local script = tonumber(ARGV[at])
  local ok, reply = pcall(SCRIPTS[script], i, at)
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
