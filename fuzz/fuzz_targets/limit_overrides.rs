//! Envoy's descriptor `limit` overrides and `hits_addend`s through the gRPC path (the body: `tollgate::fuzzing::limit_overrides`).
//! `tests/fuzz_replay.rs` runs the committed seeds through the same body in `make test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tollgate::fuzzing::limit_overrides(data));
