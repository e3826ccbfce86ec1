//! Criterion micro-benchmarks of the in-process parts of a decision: rule matching, key
//! encoding, bucket math, response building and the whole decision on the memory store.
//!
//! Run: `cargo bench --bench micro` (quick: `-- --warm-up-time 1 --measurement-time 2`).
//! Rule sets are generated here as YAML text and loaded through the real loader, so they are
//! exactly what a user's files would produce.

mod common;

use std::fmt::Write;
use std::hint::black_box;
use std::path::PathBuf;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tollgate::keys::bucket_key;
use tollgate::limiter::{Code, Decision, ReportedLimit, Request, RequestDescriptor, Status};
use tollgate::quota::bucket::{TokenBucketParams, TokenBucketState, WindowState};
use tollgate::quota::bucket::{take_token, take_window};
use tollgate::rules::LoadOptions;
use tollgate::rules::load::load_sources;
use tollgate::rules::matcher::find;
use tollgate::rules::{Algorithm, Rate, RuleSet, Unit};
use tollgate::service::request;
use tollgate::service::response::{HeaderOptions, to_proto};

fn load(yaml: &str) -> RuleSet {
    load_sources(
        &[(PathBuf::from("bench.yaml"), yaml.to_string())],
        LoadOptions::default(),
    )
    .expect("generated rules are valid")
}

/// Eight nested levels `k0=v0 → … → k7=v7`, each level with a few exact, wildcard and bare
/// siblings so every lookup walks a realistically populated level; the limit is at depth 8.
fn deep_tree() -> RuleSet {
    fn level(out: &mut String, depth: usize, indent: usize) {
        let pad = " ".repeat(indent);
        for s in 0..3 {
            let _ = writeln!(
                out,
                "{pad}- key: k{depth}\n{pad}  value: other{s}\n{pad}  rate_limit: {{unit: second, requests_per_unit: 1}}"
            );
        }
        let _ = writeln!(
            out,
            "{pad}- key: k{depth}\n{pad}  value: \"w*{depth}\"\n{pad}  rate_limit: {{unit: second, requests_per_unit: 1}}"
        );
        let _ = writeln!(out, "{pad}- key: side{depth}");
        let _ = writeln!(out, "{pad}- key: k{depth}\n{pad}  value: v{depth}");
        if depth == 7 {
            let _ = writeln!(
                out,
                "{pad}  rate_limit: {{unit: second, requests_per_unit: 100}}"
            );
        } else {
            let _ = writeln!(out, "{pad}  descriptors:");
            level(out, depth + 1, indent + 4);
        }
    }
    let mut y = String::from("domain: d\ndescriptors:\n");
    level(&mut y, 0, 2);
    load(&y)
}

/// One level with 100 wildcard values of key `path`; every pattern starts with `*`, so each
/// is fully evaluated (no cheap prefix rejection), and only the last one matches.
fn wildcard_level() -> RuleSet {
    let mut y = String::from("domain: d\ndescriptors:\n");
    for i in 0..100 {
        let _ = writeln!(
            y,
            "  - key: path\n    value: \"*/v{i}/*\"\n    rate_limit: {{unit: second, requests_per_unit: {}}}",
            i + 1
        );
    }
    load(&y)
}

/// One level with 10,000 exact `tenant` values and a bare `tenant` fallback.
fn wide_level() -> RuleSet {
    let mut y = String::from("domain: d\ndescriptors:\n");
    for i in 0..10_000 {
        let _ = writeln!(
            y,
            "  - key: tenant\n    value: t{i}\n    rate_limit: {{unit: minute, requests_per_unit: {}}}",
            i + 1
        );
    }
    y.push_str("  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n");
    load(&y)
}

fn matching(c: &mut Criterion) {
    let mut g = c.benchmark_group("match");

    let deep = deep_tree();
    let d = &deep.domains["d"];
    let entries: Vec<(String, String)> =
        (0..8).map(|i| (format!("k{i}"), format!("v{i}"))).collect();
    assert!(find(d, &entries).is_some_and(|m| !m.node.limits.is_empty()));
    // 8 exact lookups down an 8-level tree (two hash lookups per level).
    g.bench_function("deep_tree_8_levels", |b| {
        b.iter(|| find(black_box(d), black_box(entries.as_slice())))
    });

    let wild = wildcard_level();
    let d = &wild.domains["d"];
    let entries = [("path", "/api/v99/items")];
    assert_eq!(
        find(d, &entries)
            .and_then(|m| m.node.limits[0].rate)
            .map(|r| r.requests_per_unit),
        Some(100)
    );
    // A value that fails 99 `*`-patterns before the 100th matches (linear scan + glob).
    g.bench_function("wildcard_100_last_matches", |b| {
        b.iter(|| find(black_box(d), black_box(entries.as_slice())))
    });

    let wide = wide_level();
    let d = &wide.domains["d"];
    let hit = [("tenant", "t5000")];
    let fallback = [("tenant", "nobody")];
    assert_eq!(
        find(d, &hit)
            .and_then(|m| m.node.limits[0].rate)
            .map(|r| r.requests_per_unit),
        Some(5001)
    );
    assert_eq!(
        find(d, &fallback)
            .and_then(|m| m.node.limits[0].rate)
            .map(|r| r.requests_per_unit),
        Some(10)
    );
    // Exact value among 10,000 siblings: one hash lookup of key, one of value.
    g.bench_function("10k_rules_exact_hit", |b| {
        b.iter(|| find(black_box(d), black_box(&hit[..])))
    });
    // A value not among the 10,000: exact miss, empty wildcard list, then the bare key.
    g.bench_function("10k_rules_bare_fallback", |b| {
        b.iter(|| find(black_box(d), black_box(&fallback[..])))
    });
    g.finish();
}

fn rate() -> Rate {
    Rate {
        requests_per_unit: 100,
        unit: Unit::Minute,
        unit_multiplier: 1,
        burst: 100,
        algorithm: Algorithm::TokenBucket,
        calendar: None,
    }
}

fn keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("key");
    let r = rate();
    let short = [("tenant", "acme"), ("path", "/api/v1/items")];
    // Two short entries, nothing to escape: the common case.
    g.bench_function("short_values", |b| {
        b.iter(|| bucket_key("tg:", "edge", black_box(short), &r, 0, None))
    });
    let escaped = [("tenant", "a|b=c{d}#e%f"), ("path", "/q?x=1|y={2}")];
    // The same shape with separators in every value: percent-escaping on the slow path.
    g.bench_function("values_needing_escapes", |b| {
        b.iter(|| bucket_key("tg:", "edge", black_box(escaped), &r, 0, None))
    });
    let long = "x".repeat(4096);
    let hashed = [("user_agent", long.as_str())];
    // A 4 KiB value: measured for length, then replaced by its SHA-1.
    g.bench_function("value_4KiB_hashed", |b| {
        b.iter(|| bucket_key("tg:", "edge", black_box(hashed), &r, 0, None))
    });
    g.finish();
}

fn bucket_math(c: &mut Criterion) {
    let mut g = c.benchmark_group("bucket");
    let p = TokenBucketParams {
        capacity: 100,
        refill: 100,
        window_ms: 60_000,
    };
    let state = Some(TokenBucketState {
        tokens: 50.5,
        ts_ms: 1_000,
        capacity: Some(100.0),
    });
    // One token-bucket take on existing state: refill, compare, retry/reset arithmetic.
    g.bench_function("take_token", |b| {
        b.iter(|| take_token(black_box(state), black_box(2_000), p, 1, false))
    });
    let w = Some(WindowState {
        start_ms: 1_699_999_980_000,
        count: 7,
        limit: Some(100),
    });
    // One fixed-window hit in the current window.
    g.bench_function("take_window", |b| {
        b.iter(|| {
            take_window(
                black_box(w),
                black_box(1_700_000_000_000),
                100,
                60_000,
                1,
                false,
            )
        })
    });
    g.finish();
}

fn decision(n: usize) -> Decision {
    Decision {
        overall: Code::Ok,
        from_fallback: false,
        statuses: (0..n)
            .map(|i| Status {
                code: Code::Ok,
                limit: Some(ReportedLimit {
                    requests_per_unit: 100,
                    unit: Unit::Minute,
                    name: format!("limit-{i}"),
                    capacity: 100,
                    window_ms: 60_000,
                }),
                remaining: 50 + i as u32,
                reset_ms: 12_345,
                retry_ms: None,
                shadow: false,
                quota_mode: false,
                metadata: None,
                receipt: None,
            })
            .collect(),
    }
}

fn response(c: &mut Criterion) {
    let mut g = c.benchmark_group("response");
    for n in [1, 8] {
        let d = decision(n);
        for headers in [false, true] {
            let id = BenchmarkId::new(if headers { "headers" } else { "no_headers" }, n);
            // to_proto for n descriptor statuses, with or without the RateLimit-* headers.
            let headers = HeaderOptions {
                response: headers,
                ..HeaderOptions::default()
            };
            g.bench_with_input(id, &d, |b, d| b.iter(|| to_proto(black_box(d), headers)));
        }
    }
    g.finish();
}

fn descriptors<'a>(entries: &[&[(&'a str, &'a str)]]) -> Vec<RequestDescriptor<'a>> {
    entries
        .iter()
        .map(|e| RequestDescriptor {
            entries: e.to_vec(),
            hits_addend: None,
            limit_override: None,
            refund: false,
        })
        .collect()
}

const ONE: &[&[(&str, &str)]] = &[&[("tenant", "acme")]];
const FOUR: &[&[(&str, &str)]] = &[
    &[("tenant", "acme")],
    &[("tenant", "acme"), ("path", "/api/v1/items")],
    &[("remote_address", "10.1.2.3")],
    &[("plan", "gold")],
];

fn decide(c: &mut Criterion) {
    let rules = load(common::DECIDE_RULES);
    // Limits of 10^9/s never run out, so every iteration takes the same (admitted) path on
    // a hot key whose bucket already exists.
    let limiter = common::memory_limiter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let bounds = common::bounds();

    let mut g = c.benchmark_group("decide");
    // For scale: driving a ready future through a current-thread runtime's block_on, which
    // the rows below avoid (see `run`).
    g.bench_function("block_on_overhead", |b| {
        b.iter(|| rt.block_on(async { black_box(1) }))
    });
    for (name, entries) in [("1_descriptor", ONE), ("4_descriptors", FOUR)] {
        let req = Request {
            domain: "edge",
            descriptors: descriptors(entries),
            hits_addend: 0,
        };
        let d = common::run(&rt, limiter.decide(&rules, &req)).expect("memory store");
        assert!(
            d.statuses
                .iter()
                .all(|s| s.code == Code::Ok && s.limit.is_some())
        );
        // Limiter::decide on the memory store: match, keys, bucket takes, statuses, metrics.
        g.bench_function(BenchmarkId::new("limiter", name), |b| {
            b.iter(|| common::run(&rt, limiter.decide(&rules, black_box(&req))))
        });
        let pb = common::proto(entries);
        // The service's in-process path: proto → Request, decide, Decision → proto (headers on).
        g.bench_function(BenchmarkId::new("proto_to_proto", name), |b| {
            b.iter(|| {
                common::run(&rt, async {
                    let req = request::to_request(black_box(&pb), &bounds).expect("valid");
                    let d = limiter.decide(&rules, &req).await.expect("memory store");
                    to_proto(
                        &d,
                        HeaderOptions {
                            response: true,
                            ..HeaderOptions::default()
                        },
                    )
                })
            })
        });
    }
    // The same hot key through the hot-key path with leasing on: spent from the lease (a
    // claim every 1,000 decisions), plus the over-limit cache's lookup.
    let leased = common::leased_memory_limiter();
    let req = Request {
        domain: "edge",
        descriptors: descriptors(ONE),
        hits_addend: 0,
    };
    g.bench_function(BenchmarkId::new("limiter", "1_descriptor_leased"), |b| {
        b.iter(|| common::run(&rt, leased.decide(&rules, black_box(&req))))
    });
    let tenants: Vec<String> = (0..100_000).map(|i| format!("tenant-{i:06}")).collect();
    let reqs: Vec<Request<'_>> = tenants
        .iter()
        .map(|t| Request {
            domain: "edge",
            descriptors: descriptors(&[&[("tenant", t.as_str())]]),
            hits_addend: 0,
        })
        .collect();
    for r in &reqs {
        common::run(&rt, limiter.decide(&rules, r)).expect("memory store");
    }
    let mut i = 0;
    // 1 descriptor cycling over 100,000 existing buckets: hash-table cache misses included.
    g.bench_function(BenchmarkId::new("limiter", "1_descriptor_100k_keys"), |b| {
        b.iter(|| {
            i = (i + 1) % reqs.len();
            common::run(&rt, limiter.decide(&rules, black_box(&reqs[i])))
        })
    });
    g.finish();
}

criterion_group!(benches, matching, keys, bucket_math, response, decide);
criterion_main!(benches);
