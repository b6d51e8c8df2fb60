//! End to end: record each fixture program with the real probes, analyze
//! the trace, and compare the outstanding allocations with the fixture's
//! expected file: bytes, counts, and every frame's function and file:line.
//!
//! Needs root and a kernel with uprobe sessions, as CI has.
#![cfg(feature = "bpf")]

mod common;

use common::fixtures::{check_fixture, Fixture};

macro_rules! fixture_tests {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            check_fixture(&Fixture::load(stringify!($name)));
        }
    )*};
}

fixture_tests!(
    seed, realloc, aligned, mmap, big, short, inline, odd, threads, storm, cxx_new, strdup,
    dl_main, execer
);
