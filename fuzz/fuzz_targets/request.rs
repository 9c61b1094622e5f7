//! Request parsing on arbitrary bytes: must never panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_fuzz::request(data));
