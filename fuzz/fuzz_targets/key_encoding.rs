//! Key encoding on two arbitrary descriptors (the body: `tollgate::fuzzing::key_encoding`).
//! `tests/fuzz_replay.rs` runs the committed seeds through the same body in `make test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::fuzzing::key_encoding(data));
