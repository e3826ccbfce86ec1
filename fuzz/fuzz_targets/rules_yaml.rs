//! The rules loader on arbitrary bytes: any file is loaded or refused with an error, never a
//! panic, a hang or unbounded memory.
#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use tollgate::rules::LoadOptions;
use tollgate::rules::load::load_sources;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let _ = load_sources(
        &[(PathBuf::from("fuzz.yaml"), text)],
        LoadOptions::default(),
    );
});
