//! Skipping a test that cannot run here, and refusing to where every test
//! must run.
//!
//! A test that needs root or a tool this machine lacks says why in one
//! line and returns, and counts as passed. CI sets `MEMLEAK_REQUIRE_ALL=1`
//! (`.ci/run`), under which such a test fails instead, with the same
//! reason: a green CI run has run every test.
//!
//! Every test crate of the workspace uses this file: the memleak binary's
//! through `tests/common`, the others with `#[path]`.
#![allow(dead_code)]

/// The variable under which a test that would be skipped fails instead.
pub const REQUIRE_ALL: &str = "MEMLEAK_REQUIRE_ALL";

/// Whether skipping is refused: [`REQUIRE_ALL`] is set, to anything but
/// "" or "0".
pub fn required() -> bool {
    std::env::var_os(REQUIRE_ALL).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Says in one line why the calling test does not run here; the caller
/// then returns. Under [`REQUIRE_ALL`] it fails the test with that reason
/// instead.
#[track_caller]
pub fn skip(reason: impl std::fmt::Display) {
    if required() {
        panic!("{REQUIRE_ALL} is set, and this test would be skipped: {reason}");
    }
    eprintln!("skipping: {reason}");
}
