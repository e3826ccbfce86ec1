//! `tollgate simulate` scenario files, checked as the command checks them (the body: `tollgate::fuzzing::simulate_scenario`).
//! `tests/fuzz_replay.rs` runs the committed seeds through the same body in `make test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::fuzzing::simulate_scenario(data));
