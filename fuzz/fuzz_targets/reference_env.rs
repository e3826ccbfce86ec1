//! envoyproxy/ratelimit's environment through a replica's start-up (the body: `tollgate::fuzzing::reference_env`).
//! `tests/fuzz_replay.rs` runs the committed seeds through the same body in `make test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::fuzzing::reference_env(data));
