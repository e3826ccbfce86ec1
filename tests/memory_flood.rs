//! A flood of 10,000,000 distinct keys (random tenant ids, as an attacker would send) against
//! the memory store with its default bound: resident memory stays under 256 MiB and a hot key
//! in use throughout keeps its exact count. Its own test binary (one test), so the resident
//! size it samples is this flood's; on mimalloc, the allocator the `tollgate` binary uses.

use std::time::Instant;

use mimalloc::MiMalloc;
use tollgate::clock::Clock;
use tollgate::quota::{Op, OpKind};
use tollgate::store::MemoryStore;
use tollgate::store::memory::DEFAULT_MAX_KEYS;

#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

const FLOOD: u64 = 10_000_000;
const RSS_BOUND: u64 = 256 << 20;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// An hour-long limit of 1,000 on a key shaped like tollgate's own.
fn take(key: String) -> Op {
    Op {
        key,
        kind: OpKind::TokenBucket {
            capacity: 1_000,
            refill: 1_000,
            window_ms: 3_600_000,
        },
        cost: 1,
        action: Default::default(),
    }
}

#[test]
fn ten_million_distinct_keys_stay_under_256_mib_and_a_hot_key_stays_exact() {
    let store = MemoryStore::new(Clock::system());
    let started = Instant::now();
    let mut peak = rss_bytes();
    let mut hot_admitted = 0u64;
    let mut hot_attempts = 0u64;
    // A cheap, well-mixed sequence of "random" tenant ids (splitmix64).
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..FLOOD {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        store.apply(&take(format!(
            "tollgate:{{edge|tenant={z:016x}|tb:3600000:0}}"
        )));
        // The hot tenant, every 2,000 flood requests: 5,000 attempts on a limit of 1,000.
        if i % 2_000 == 0 {
            hot_attempts += 1;
            hot_admitted += u64::from(
                store
                    .apply(&take("tollgate:{edge|tenant=hot|tb:3600000:0}".into()))
                    .allowed,
            );
        }
        if i % 500_000 == 0 {
            peak = peak.max(rss_bytes());
        }
    }
    peak = peak.max(rss_bytes());
    println!(
        "{FLOOD} distinct keys in {:.1} s: {} held (bound {DEFAULT_MAX_KEYS}), {} evicted, peak RSS {:.1} MiB; hot key {hot_admitted} of {hot_attempts} admitted",
        started.elapsed().as_secs_f64(),
        store.len(),
        store.evicted(),
        peak as f64 / (1 << 20) as f64
    );
    assert!(store.len() <= DEFAULT_MAX_KEYS + 64, "{}", store.len());
    assert!(peak < RSS_BOUND, "peak RSS {} MiB ≥ 256 MiB", peak >> 20);
    // Nothing refills noticeably during the run (1,000 per hour), and the hot bucket, in use
    // from its second request on, is never evicted: exactly the limit, plus at most what
    // refilled while the test ran.
    let refilled = (started.elapsed().as_secs() * 1_000).div_ceil(3_600);
    assert!(
        (1_000..=1_000 + refilled).contains(&hot_admitted),
        "{hot_admitted} admitted (refill allowance {refilled})"
    );
}
