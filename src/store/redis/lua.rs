//! The Lua sources the Redis store runs, compiled into the binary: one script per algorithm
//! (`lua/`, each opening with its KEYS, ARGV and reply), and the batch script put together from
//! them (`lua/batch.lua` around each algorithm script wrapped as a function, its `TIME` read once
//! per batch). `scripts.rs` sends one script per op, `batch_script.rs` the batch.
//!
//! The token bucket's and the fixed window's state have two formats (`token_bucket.lua`'s and
//! `fixed_window.lua`'s headers): both are read, and [`StateFormat`] says which one is written.
//! [`Sources::of`] gives the scripts as sent for one format: `token_bucket.lua`,
//! `fixed_window.lua` and `lease.lua` with their `HASH_STATE` line set, and the batch script
//! around them.

use std::sync::LazyLock;

/// `lua/token_bucket.lua`, compiled into the binary.
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../../lua/token_bucket.lua");
/// `lua/fixed_window.lua`, compiled into the binary.
pub const FIXED_WINDOW_LUA: &str = include_str!("../../../lua/fixed_window.lua");
/// `lua/sliding_window.lua`, compiled into the binary.
pub const SLIDING_WINDOW_LUA: &str = include_str!("../../../lua/sliding_window.lua");
/// `lua/sliding_log.lua`, compiled into the binary.
pub const SLIDING_LOG_LUA: &str = include_str!("../../../lua/sliding_log.lua");
/// `lua/lease.lua`, compiled into the binary.
pub const LEASE_LUA: &str = include_str!("../../../lua/lease.lua");

/// The dispatcher, `lua/batch.lua`.
pub(super) const DISPATCH_LUA: &str = include_str!("../../../lua/batch.lua");

/// The scripts a batch can run, by their number in `ARGV` (1-based, as `lua/batch.lua` says).
pub const BATCHED_LUA: [&str; 5] = [
    TOKEN_BUCKET_LUA,
    FIXED_WINDOW_LUA,
    SLIDING_WINDOW_LUA,
    SLIDING_LOG_LUA,
    LEASE_LUA,
];

/// How the token bucket's and the fixed window's state is written in Redis
/// (`store_state_format`); both are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateFormat {
    /// One string of three doubles (`SET … PX`): the cheaper one for Redis.
    #[default]
    Packed,
    /// 0.1.0's two-field hashes (`HSET` + `PEXPIRE`), which 0.1.0 replicas can read: for the
    /// length of a rolling upgrade, or a rollback, with 0.1.0 beside this release.
    Hash,
}

impl StateFormat {
    /// What `store_state_format` accepts, for error messages.
    pub const NAMES: &'static str = "packed or hash";
}

/// The line of `token_bucket.lua`, `fixed_window.lua` and `lease.lua` that picks the format
/// written; `Hash` turns it to `true`.
pub const HASH_STATE_OFF: &str = "local HASH_STATE = false";

/// `source` writing 0.1.0's hash: its [`HASH_STATE_OFF`] line, which must be there once, on.
pub fn writing_hash(source: &str) -> String {
    assert_eq!(
        source.matches(HASH_STATE_OFF).count(),
        1,
        "a script that writes a bucket's state says HASH_STATE once"
    );
    source.replace(HASH_STATE_OFF, "local HASH_STATE = true")
}

static TOKEN_BUCKET_HASH_LUA: LazyLock<String> = LazyLock::new(|| writing_hash(TOKEN_BUCKET_LUA));
static FIXED_WINDOW_HASH_LUA: LazyLock<String> = LazyLock::new(|| writing_hash(FIXED_WINDOW_LUA));
static LEASE_HASH_LUA: LazyLock<String> = LazyLock::new(|| writing_hash(LEASE_LUA));
static BATCH_HASH_LUA: LazyLock<String> = LazyLock::new(|| {
    batch_lua(
        [
            TOKEN_BUCKET_HASH_LUA.as_str(),
            FIXED_WINDOW_HASH_LUA.as_str(),
            SLIDING_WINDOW_LUA,
            SLIDING_LOG_LUA,
            LEASE_HASH_LUA.as_str(),
        ],
        TIME,
    )
});

/// The scripts as sent for one [`StateFormat`]; the others are the same in both.
#[derive(Clone, Copy, Debug)]
pub struct Sources {
    pub token_bucket: &'static str,
    pub fixed_window: &'static str,
    pub lease: &'static str,
    pub batch: &'static str,
}

impl Sources {
    pub fn of(format: StateFormat) -> Sources {
        match format {
            StateFormat::Packed => Sources {
                token_bucket: TOKEN_BUCKET_LUA,
                fixed_window: FIXED_WINDOW_LUA,
                lease: LEASE_LUA,
                batch: BATCH_LUA.as_str(),
            },
            StateFormat::Hash => Sources {
                token_bucket: TOKEN_BUCKET_HASH_LUA.as_str(),
                fixed_window: FIXED_WINDOW_HASH_LUA.as_str(),
                lease: LEASE_HASH_LUA.as_str(),
                batch: BATCH_HASH_LUA.as_str(),
            },
        }
    }
}

/// What every algorithm script reads the clock with, once.
pub(super) const TIME: &str = "redis.call('TIME')";

/// The batch script as sent: [`batch_lua`] of the scripts of `lua/` on Redis `TIME`.
pub static BATCH_LUA: LazyLock<String> = LazyLock::new(|| batch_lua(BATCHED_LUA, TIME));

/// Where `token_bucket.lua`'s and `fixed_window.lua`'s functions end and their one call's
/// entry (ARGV, `TIME`) begins: a batch takes the part above once and calls `take_token` or
/// `take_window` for each op of theirs.
pub const ENTRY_MARK: &str = "-- ENTRY:";

/// How a batch sends a token-bucket op's five numbers: one argument, `struct.pack('<ddddB')`
/// of capacity, refill, window_ms and cost as doubles and the overdraft flag as a byte. Each
/// double is the `u64 as f64` Rust's mirror computes with, which is the double `tonumber`
/// makes of the decimal the single script is sent (both round to nearest), so a batched take
/// sees exactly the numbers a single one does; `tests/lua_batch.rs` holds the two to the same
/// answers, `u64::MAX` costs included.
pub fn packed_token_bucket_args(args: &[u64; 5]) -> [u8; 33] {
    let mut out = [0u8; 33];
    for (i, n) in args[..4].iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&(*n as f64).to_le_bytes());
    }
    out[32] = u8::from(args[4] == 1);
    out
}

/// How a batch sends a fixed-window op's seven numbers (`fixed_window.lua`'s ARGV): one
/// argument, `struct.pack('<dddBBdd')` of limit, window_ms and cost as doubles, the mode and
/// the calendar as bytes (0–3 and 0–4), the calendar's offset argument and a give-back's
/// receipt (0: none) as doubles, the same doubles `tonumber` makes of the decimals the single
/// script is sent (see [`packed_token_bucket_args`]).
pub fn packed_fixed_window_args(args: &[u64; 7]) -> [u8; 42] {
    let mut out = [0u8; 42];
    for (i, n) in args[..3].iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&(*n as f64).to_le_bytes());
    }
    // Both are small (a mode 0-3, a calendar 0-4); saturate rather than wrap anything else.
    out[24] = u8::try_from(args[3]).unwrap_or(u8::MAX);
    out[25] = u8::try_from(args[4]).unwrap_or(u8::MAX);
    out[26..34].copy_from_slice(&(args[5] as f64).to_le_bytes());
    out[34..42].copy_from_slice(&(args[6] as f64).to_le_bytes());
    out
}

/// `script` split at [`ENTRY_MARK`]: its functions, defined once per batch, and its
/// entry, which alone reads `TIME`.
fn functions_of<'a>(script: &'a str, name: &str) -> &'a str {
    let (functions, entry) = script
        .split_once(ENTRY_MARK)
        .unwrap_or_else(|| panic!("{name} marks its entry"));
    assert!(
        entry.contains(TIME) && !functions.contains(TIME),
        "{name} reads TIME only in its entry"
    );
    functions
}

/// The batch script of `scripts` (in [`BATCHED_LUA`]'s order): `batch_time` = `time` (a Lua
/// expression giving `{seconds, microseconds}`, as `TIME` does), then the scripts, then the
/// dispatcher.
///
/// The token bucket and the fixed window, the takes nearly every decision is, run leanest:
/// `token_bucket.lua` and `fixed_window.lua` above [`ENTRY_MARK`] (`take_token`,
/// `take_window` and their helpers) are defined once per call, and `SCRIPTS[1]` and
/// `SCRIPTS[2]` unpack the op's one packed argument ([`packed_token_bucket_args`],
/// [`packed_fixed_window_args`]) and call them on the batch's clock: no closure is built and
/// no decimal parsed per op.
///
/// Each other script is wrapped as `SCRIPTS[n] = function(KEY, B) … end`, reading the batch's
/// own `ARGV` where it is: its `KEYS[1]` is `KEY` (its op's key, which the dispatcher passes in
/// from either layout) and each `ARGV[n]` is `ARGV[B + n]` (its arguments, after its script
/// number), so running an op builds no table of its own; its `redis.call('TIME')` reads
/// `batch_time`. Public so the tests can build it on a test clock.
pub fn batch_lua(scripts: [&str; 5], time: &str) -> String {
    let mut lua =
        String::with_capacity(scripts.iter().map(|s| s.len() + 256).sum::<usize>() + 2048);
    lua.push_str("local batch_time = ");
    lua.push_str(time);
    lua.push_str("\nlocal SCRIPTS = {}\n");
    lua.push_str(concat!(
        "local batch_now_ms = tonumber(batch_time[1]) * 1000",
        " + math.floor(tonumber(batch_time[2]) / 1000)\n",
    ));
    // Each in a block of its own: their local helpers keep their names apart.
    lua.push_str("do\n");
    lua.push_str(functions_of(scripts[0], "token_bucket.lua"));
    lua.push_str(concat!(
        "\nSCRIPTS[1] = function(KEY, B)\n",
        "  local capacity, refill, window_ms, cost, overdraft = struct.unpack('<ddddB', ARGV[B + 1])\n",
        "  return take_token(KEY, batch_now_ms, capacity, refill, window_ms, cost, overdraft == 1)\n",
        "end\nend\ndo\n",
    ));
    lua.push_str(functions_of(scripts[1], "fixed_window.lua"));
    lua.push_str(concat!(
        "\nSCRIPTS[2] = function(KEY, B)\n",
        "  local limit, window_ms, cost, mode, calendar, offset, receipt =\n",
        "    struct.unpack('<dddBBdd', ARGV[B + 1])\n",
        "  return take_window(KEY, batch_now_ms, limit, window_ms, cost, mode, calendar,\n",
        "    (offset - 1080) * 60000, receipt)\n",
        "end\nend\n",
    ));
    for (i, script) in scripts.iter().enumerate().skip(2) {
        lua.push_str(&format!("SCRIPTS[{}] = function(KEY, B)\n", i + 1));
        lua.push_str(
            &script
                .replace(TIME, "batch_time")
                .replace("KEYS[1]", "KEY")
                .replace("ARGV[", "ARGV[B + "),
        );
        lua.push_str("\nend\n");
    }
    lua.push_str(DISPATCH_LUA);
    lua
}
