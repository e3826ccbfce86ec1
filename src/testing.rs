//! What the unit tests share: the property tests' configuration, so `make test` draws the
//! same cases on every run and only `make explore` draws new ones.
//!
//! A property test in `make test` runs a fixed, committed seed ([`SEED`]) plus every failure
//! saved under `proptest-regressions/` (proptest replays those first). `make explore` sets
//! `TOLLGATE_EXPLORE=1`: a random seed and ten times the cases, and a failure it finds is saved
//! there as a regression, which then reaches `make test` once committed. tests/common/mod.rs
//! holds the same rule for the integration tests.

use proptest::test_runner::{Config, RngSeed};

/// The seed every property test of `make test` draws its cases from.
pub const SEED: u64 = 0x7011_6a7e_2026_1207;

/// `cases` cases from [`SEED`]; under `TOLLGATE_EXPLORE=1`, ten times as many from a random
/// seed. Failures persist to `proptest-regressions/` (proptest's default) either way.
pub fn proptest_config(cases: u32) -> Config {
    let explore = std::env::var_os("TOLLGATE_EXPLORE").is_some_and(|v| v == "1");
    Config {
        cases: if explore { cases * 10 } else { cases },
        rng_seed: if explore {
            RngSeed::Random
        } else {
            RngSeed::Fixed(SEED)
        },
        ..Config::default()
    }
}
