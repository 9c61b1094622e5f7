//! Archive extraction on arbitrary bytes: must never panic nor write
//! outside the workspace.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = airlock_fuzz::extract(data) {
        panic!("{e}");
    }
});
