//! `cargo fuzz run trace_reader`: one file of a small trace replaced by the
//! input, then opened, read and analyzed (docs/format.md). Any panic,
//! hang or runaway allocation is a bug: damage must be an error.
#![no_main]

#[path = "../src/harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
