-- batch.lua: several bucket ops in one script call, each exactly as its own script would run
-- it alone, in order. The Redis client sends one when decisions queue for a busy node
-- (`src/store/redis/batch.rs`): one EVALSHA instead of one per op saves Redis the per-call
-- work (parsing, the script's setup, the reply) and reads `TIME` once for all of them.
--
-- This file is the dispatcher. Before it, `src/store/redis/lua.rs` defines
-- `batch_time` (one `TIME`) and `SCRIPTS[n]`: each algorithm script of `lua/`, unchanged but for
-- its `TIME` (it reads `batch_time`), wrapped as `function(KEYS, ARGV) … end`:
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

local NARGS = {5, 4, 4, 3, 8}

local out = {}
local at = 1
for i = 1, #KEYS do
  local script = tonumber(ARGV[at])
  local n = NARGS[script]
  local args = {}
  for j = 1, n do
    args[j] = ARGV[at + j]
  end
  at = at + n + 1
  local ok, reply = pcall(SCRIPTS[script], {KEYS[i]}, args)
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
