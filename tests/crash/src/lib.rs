//! The crash matrix lives in `tests/crash_matrix.rs`; this crate has no library code.
