//! Memory of the in-process store, and heap allocations per decision.
//!
//! Run: `cargo bench --bench memory` (plain `main`, no criterion).
//!
//! 1. Resident set size (from `/proc/self/statm`) before and after 1,000,000 distinct token
//!    buckets in a [`MemoryStore`], with realistic keys made by [`keys::bucket_key`]; printed
//!    as bytes per key and as a JSON line for `make bench`.
//! 2. After the buckets have refilled, `sweep()` drops them all: the key count falls to 0
//!    (resident size may stay up: the allocator keeps freed pages for reuse).
//! 3. Heap allocations per request on the in-process path (`service::request::to_request`,
//!    `Limiter::decide` on the memory store, `response::to_proto`), counted by a wrapper
//!    around the system allocator, so a change that adds one shows up as a number.
//! 4. With `TOLLGATE_BENCH_STORES` set to Redis URLs (space-separated; `make bench` passes its
//!    Redis and its cluster), the same count for `Limiter::decide` on each of those stores: the
//!    Redis client's own allocations included (its driver task runs on the same thread, and the
//!    counter is global). Reported per store, so a change to the Redis path shows up too.

mod common;

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tollgate::clock::Clock;
use tollgate::keys;
use tollgate::limiter::{Limiter, LimiterConfig};
use tollgate::quota::{Op, OpKind};
use tollgate::rules::LoadOptions;
use tollgate::rules::load::load_sources;
use tollgate::rules::{Algorithm, Rate, Unit};
use tollgate::service::request;
use tollgate::service::response::{HeaderOptions, to_proto};
use tollgate::settings::Settings;
use tollgate::store::{MemoryStore, Store};
use tollgate::telemetry::Metrics;

/// `response_headers` on, as the RateLimit-* header rows measure.
const RESPONSE_HEADERS: HeaderOptions = HeaderOptions {
    response: true,
    request: false,
    every_limit: false,
};

/// Counts allocations (and reallocations) made through the global allocator; frees are not
/// counted. Everything is delegated unchanged to mimalloc, the allocator the `tollgate` binary
/// uses, so resident memory per key is what a server would show.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards its arguments unchanged to `MiMalloc`, which upholds the
// `GlobalAlloc` contract; the only addition is a relaxed counter increment. (The crate itself
// forbids unsafe code; this bench-only wrapper is the one way to count allocations without a
// dependency.)
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as received (see the impl's comment).
        unsafe { MiMalloc.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const KEYS: u64 = 1_000_000;

fn main() {
    let page = page_size();
    memory_store(page);
    allocations_per_request();
    if let Ok(urls) = std::env::var("TOLLGATE_BENCH_STORES") {
        for url in urls.split_whitespace() {
            allocations_per_decision_on(url);
        }
    }
}

/// The page size from `getconf PAGESIZE` (no libc binding needed); 4096 if that fails.
fn page_size() -> u64 {
    std::process::Command::new("getconf")
        .arg("PAGESIZE")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

/// Resident set size in bytes: the second field of `/proc/self/statm`, in pages.
fn rss_bytes(page: u64) -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm (Linux)");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm's resident field");
    pages * page
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The key of bucket `i`: half per-tenant, half per-client-address, as `limiter` builds them
/// (41–49 bytes, e.g. `tg:{edge|tenant=tenant-0000042|tb:60000:100}`).
fn key(i: u64, minute: &Rate, second: &Rate) -> String {
    if i.is_multiple_of(2) {
        let tenant = format!("tenant-{i:07}");
        keys::bucket_key(
            "tg:",
            "edge",
            [("tenant", tenant.as_str())],
            minute,
            0,
            None,
        )
    } else {
        let addr = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        keys::bucket_key(
            "tg:",
            "edge",
            [("remote_address", addr.as_str())],
            second,
            0,
            None,
        )
    }
}

fn rate(unit: Unit) -> Rate {
    Rate {
        requests_per_unit: 100,
        unit,
        unit_multiplier: 1,
        burst: 100,
        algorithm: Algorithm::TokenBucket,
        calendar: None,
    }
}

fn memory_store(page: u64) {
    let (minute, second) = (rate(Unit::Minute), rate(Unit::Second));
    let clock = Clock::manual(1_700_000_000_000);
    // A bound well above KEYS (the shards fill unevenly): this measures bytes per bucket held,
    // not eviction.
    let store = MemoryStore::with_max_keys(clock.clone(), 2 * KEYS as usize);

    let before = rss_bytes(page);
    let started = Instant::now();
    let mut key_bytes = 0u64;
    for i in 0..KEYS {
        let k = key(i, &minute, &second);
        key_bytes += k.len() as u64;
        let r = if i.is_multiple_of(2) {
            &minute
        } else {
            &second
        };
        let op = Op {
            key: k,
            kind: OpKind::TokenBucket {
                capacity: r.burst,
                refill: u64::from(r.requests_per_unit),
                window_ms: r.window_ms(),
            },
            cost: 1,
            action: Default::default(),
        };
        assert!(store.apply(&op).allowed);
    }
    let insert_time = started.elapsed();
    let after = rss_bytes(page);
    assert_eq!(store.len() as u64, KEYS);

    let grown = after.saturating_sub(before);
    let per_key = grown / KEYS;
    println!(
        "memory store: {KEYS} keys, RSS +{:.1} MiB, {per_key} bytes/key (mean key {:.1} bytes; \
         RSS {:.1} → {:.1} MiB; {:.0} inserts/s on one thread)",
        mib(grown),
        key_bytes as f64 / KEYS as f64,
        mib(before),
        mib(after),
        KEYS as f64 / insert_time.as_secs_f64(),
    );
    println!(r#"{{"bench":"memory_store","keys":{KEYS},"rss_bytes_per_key":{per_key}}}"#);

    // One token of 100/minute refills in 600 ms, so every bucket is full again (idle) once a
    // minute has passed; sweep must then drop them all.
    clock.advance_ms(60_001);
    let started = Instant::now();
    let dropped = store.sweep();
    let sweep_time = started.elapsed();
    let swept = rss_bytes(page);
    println!(
        "memory store: sweep after refill dropped {dropped} keys in {:.0} ms; {} keys left; \
         RSS {:.1} MiB ({:+.1} MiB vs before the sweep; freed memory may stay with the allocator)",
        sweep_time.as_secs_f64() * 1000.0,
        store.len(),
        mib(swept),
        mib(swept) - mib(after),
    );
    assert_eq!(store.len(), 0);
}

/// A request's descriptors, each a list of (key, value) entries.
type Descriptors<'a> = &'a [&'a [(&'a str, &'a str)]];

/// The requests the allocation counts use: one descriptor, and four (one of two entries).
const ONE: Descriptors<'static> = &[&[("tenant", "acme")]];
const FOUR: Descriptors<'static> = &[
    &[("tenant", "acme")],
    &[("tenant", "acme"), ("path", "/api/v1/items")],
    &[("remote_address", "10.1.2.3")],
    &[("plan", "gold")],
];

/// The decision benchmarks' rules (`common::DECIDE_RULES`), loaded.
fn decide_rules() -> tollgate::rules::RuleSet {
    load_sources(
        &[(
            PathBuf::from("bench.yaml"),
            common::DECIDE_RULES.to_string(),
        )],
        LoadOptions::default(),
    )
    .expect("valid rules")
}

/// Mean allocations per call of `f` over `n` calls.
fn allocs(n: u64, mut f: impl FnMut()) -> f64 {
    let start = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..n {
        f();
    }
    (ALLOCS.load(Ordering::Relaxed) - start) as f64 / n as f64
}

fn allocations_per_request() {
    let rules = decide_rules();
    let limiter = common::memory_limiter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let bounds = common::bounds();
    const N: u64 = 10_000;
    for (name, entries) in [("1 descriptor", ONE), ("4 descriptors", FOUR)] {
        let pb = common::proto(entries);
        let req = request::to_request(&pb, &bounds).expect("valid");
        // Warm up: the buckets and the metric series exist from here on (the steady state).
        let decision = common::run(&rt, limiter.decide(&rules, &req)).expect("memory store");
        let to_request = allocs(N, || {
            black_box(request::to_request(black_box(&pb), &bounds).expect("valid"));
        });
        let decide = allocs(N, || {
            black_box(
                common::run(&rt, limiter.decide(&rules, black_box(&req))).expect("memory store"),
            );
        });
        let plain = allocs(N, || {
            black_box(to_proto(black_box(&decision), HeaderOptions::default()));
        });
        let headers = allocs(N, || {
            black_box(to_proto(black_box(&decision), RESPONSE_HEADERS));
        });
        println!(
            "allocations per request, {name}: to_request {to_request:.0}, decide {decide:.0}, \
             to_proto {plain:.0} (with RateLimit headers {headers:.0}); total {:.0} (with headers {:.0})",
            to_request + decide + plain,
            to_request + decide + headers,
        );
        println!(
            r#"{{"bench":"allocations_per_request","descriptors":{},"to_request":{to_request:.0},"decide":{decide:.0},"to_proto":{plain:.0},"to_proto_headers":{headers:.0}}}"#,
            entries.len()
        );
    }
}

/// Allocations per `Limiter::decide` on the Redis store at `url` (a plain Redis or a cluster),
/// 1 and 4 descriptors, everything admitted. Each call is a real round trip, so fewer
/// iterations than in process; the pool's keeper may allocate while it runs (a ping per
/// second), a rounding error over these counts.
fn allocations_per_decision_on(url: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let rules = decide_rules();
    let metrics = Metrics::new();
    let settings = Settings {
        store: url.to_string(),
        ..Settings::default()
    };
    let store = match rt.block_on(Store::connect(
        tollgate::configs::store_config(&settings),
        Clock::system(),
        &metrics,
    )) {
        // An unreachable Redis still yields a store (the fallback would decide): not counted.
        Ok(store) if store.state() == "connected" => store,
        Ok(store) => {
            eprintln!("allocations on {url}: not connected ({store:?})");
            return;
        }
        Err(e) => {
            eprintln!("allocations on {url}: {e}");
            return;
        }
    };
    let label = if url.contains("+cluster") {
        "redis-cluster"
    } else {
        "redis"
    };
    let limiter = Limiter::new(
        store,
        LimiterConfig {
            // Own keys: never the ones the load scenarios count.
            key_prefix: "tg-allocs:".into(),
            ..LimiterConfig::new(Clock::system())
        },
        std::sync::Arc::new(metrics),
    );
    let bounds = common::bounds();
    const N: u64 = 2_000;
    for entries in [ONE, FOUR] {
        let pb = common::proto(entries);
        let req = request::to_request(&pb, &bounds).expect("valid");
        for _ in 0..100 {
            let d = rt.block_on(limiter.decide(&rules, &req));
            assert!(d.is_ok(), "{url}: {d:?}");
        }
        let decide = allocs(N, || {
            black_box(rt.block_on(limiter.decide(&rules, black_box(&req))).ok());
        });
        println!(
            "allocations per decision on {label}, {} descriptor(s): {decide:.1}",
            entries.len()
        );
        println!(
            r#"{{"bench":"allocations_per_decision","store":"{label}","descriptors":{},"decide":{decide:.1}}}"#,
            entries.len()
        );
    }
}
