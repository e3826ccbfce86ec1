//! RLQS usage reports over one stream, as a peer may send them (the body: `tollgate::fuzzing::rlqs_reports`).
//! `tests/fuzz_replay.rs` runs the committed seeds through the same body in `make test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::fuzzing::rlqs_reports(data));
