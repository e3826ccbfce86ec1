//! One xDS RateLimitConfig resource through the rules' xDS source (the body: `tollgate::fuzzing::xds_config`).
//! `tests/fuzz_replay.rs` runs the committed seeds through the same body in `make test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::fuzzing::xds_config(data));
