//! The admin port's `POST /json` body on arbitrary bytes (the body: `tollgate::fuzzing::json_body`).
//! `tests/fuzz_replay.rs` runs the committed seeds through the same body in `make test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::fuzzing::json_body(data));
