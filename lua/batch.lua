-- batch.lua: several bucket ops in one script call, each exactly as its own script would run
-- it alone, in order. The Redis client sends one when decisions queue for a busy node
-- (`src/store/redis/batch.rs`): one EVALSHA instead of one per op saves Redis the per-call
-- work (parsing, the script's setup, the reply) and reads `TIME` once for all of them.
--
-- This file is the dispatcher. Before it, `src/store/redis/lua.rs` defines
-- `batch_time` (one `TIME`) and `SCRIPTS[n]`, a function(KEY, B) per algorithm script of
-- `lua/`, each reading its op's arguments from this call's `ARGV` after `ARGV[B]` (its
-- number), so an op runs on the call's own arrays and no table is built for it:
--   1 token_bucket.lua: `take_token`, defined once per call, on one argument packing the
--     script's five numbers (`struct.pack('<ddddB')`: see `packed_token_bucket_args`);
--   2 fixed_window.lua: `take_window`, the same way, on its seven (`struct.pack('<dddBBdd')`:
--     see `packed_fixed_window_args`);
--   3 sliding_window.lua, 4 sliding_log.lua, 5 lease.lua: the script
--     unchanged but for where it reads (its `TIME` reads `batch_time`, its `KEYS[1]` is `KEY`,
--     its `ARGV[n]` is `ARGV[B + n]`), with the script's own arguments.
--
-- Two layouts, told apart by ARGV[1] (a script number is never negative):
--
-- Standalone Redis (and Sentinel): every op's key declared.
--   KEYS[i]  the key of op i (every script takes one key)
--   ARGV     for each op in order: its script's number, then its `NARGS[n]` arguments (the
--            token bucket's or fixed window's one packed argument, or the script's own ARGV:
--            see its header)
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
-- The reply: when every op answered its numbers, one string of them, five little-endian
-- doubles an op (a fixed window's take answers five, the others four and a -1; an array of arrays costs Redis a reply per number, and the client a parse
-- per number); when any op failed, one reply per op, each as its script answers alone (its
-- error an error reply).
--
local NARGS = {1, 1, 5, 3, 8}

local out = {}
-- Whether every op answered four numbers (five: a fixed window's take adds the count it
-- found), as each script does unless it fails.
local packed = true
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
    if type(reply) ~= 'table' or reply.err or #reply < 4 or #reply > 5 then
      packed = false
    end
  elseif type(reply) == 'table' and reply.err then
    -- Redis 7 raises a command's error as a table: kept, so the client classifies it
    -- (OOM, WRONGTYPE, …) as it would the script's own error.
    out[i] = reply
    packed = false
  else
    out[i] = {err = tostring(reply)}
    packed = false
  end
end
if not packed then
  -- One reply per op, each as its script answers alone, errors included.
  return out
end
-- Every op answered its numbers: all of them as one string of little-endian doubles, five
-- an op, the fifth -1 where the op answered four (`packed_replies` in
-- src/store/redis/batch_script.rs), which Redis sends on as it is.
for i = 1, n do
  local r = out[i]
  out[i] = struct.pack('<ddddd', r[1], r[2], r[3], r[4], r[5] or -1)
end
return table.concat(out)
