//! The rules loader on arbitrary bytes (the body: `tollgate::fuzzing::rules_yaml`).
//! `tests/fuzz_replay.rs` runs the committed seeds through the same body in `make test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::fuzzing::rules_yaml(data));
