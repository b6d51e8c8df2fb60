//! End to end: record each fixture program with the real probes, analyze
//! the trace, and compare the outstanding allocations with the fixture's
//! expected file: bytes, counts, and every frame's function and file:line.
//!
//! Needs root and a kernel with uprobe sessions, as CI has.
#![cfg(feature = "bpf")]

mod common;

use common::fixtures::{check_fixture, check_trace, Fixture};

macro_rules! fixture_tests {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if !common::can_record() {
                return;
            }
            check_fixture(&Fixture::load(stringify!($name)));
        }
    )*};
}

fixture_tests!(
    seed, realloc, aligned, mmap, big, short, inline, odd, threads, storm, cxx_new, strdup,
    dl_main, execer, deep, longjmp, sigalt, siglongjmp, sighandler
);

/// The fixtures built without frame pointers: the probe unwinds with the
/// objects' unwind tables, and every stack of the program is the one the
/// frame-pointer build gives (the same expected file, frame by frame,
/// inlined frames included) and complete.
macro_rules! unwound_fixture_tests {
    ($build:expr; $($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if !common::can_record() {
                return;
            }
            let fx = common::fixtures::Fixture::load_built(stringify!($name), $build);
            common::fixtures::check_fixture_complete(&fx, &[]);
        }
    )*};
}

mod omit_frame_pointer {
    use super::common;
    unwound_fixture_tests!(
        common::fixtures::Build::OmitFramePointer;
        seed, realloc, aligned, mmap, big, short, inline, odd, threads, storm, cxx_new, strdup,
        dl_main, execer, deep, longjmp, sigalt, siglongjmp, sighandler
    );
}

mod o2 {
    use super::common;
    unwound_fixture_tests!(
        common::fixtures::Build::O2;
        seed, realloc, aligned, mmap, big, short, inline, odd, threads, storm, cxx_new, strdup,
        dl_main, execer, deep, longjmp, sigalt, siglongjmp, sighandler
    );
}

/// With --follow-forks the child is held at fork until its probes are in
/// place, and its leaks are attributed to its own pid.
#[test]
fn forker_follow_forks() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("forker");
    let (_dir, trace) = fx.record(&["--follow-forks"]);
    let report = check_trace(&fx, &trace, &["outstanding", "child_outstanding"]);
    let pids = memleak_trace::Trace::open(&trace)
        .unwrap()
        .meta()
        .pids
        .clone();
    assert_eq!(pids.len(), 2, "parent and child recorded: {pids:?}");
    for s in report.stacks.iter().filter(|s| s.count > 0) {
        let in_child = s
            .frames
            .iter()
            .any(|f| f.function.as_deref() == Some("child_leak"));
        let want = if in_child { pids[1] } else { pids[0] };
        assert_eq!(
            s.pid,
            Some(want),
            "stack {} attributed to the wrong process",
            s.stack_id
        );
    }
    // The lineage is recorded, and --pid CHILD reports the child's leaks.
    let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
    assert_eq!(meta.parents.get(&pids[1]), Some(&pids[0]));
    let only_child = memleak_analyze::report::AnalyzeOptions {
        filter: memleak_analyze::Filter {
            pids: vec![pids[1]],
            ..Default::default()
        },
        ..Default::default()
    };
    let child = memleak_analyze::report::analyze(&trace, &only_child).unwrap();
    assert_eq!(
        fx.actual_groups(&child).0,
        fx.expected_groups(&["child_outstanding"])
    );
}

/// Without --follow-forks the child is not traced at all.
#[test]
fn forker_parent_only() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("forker");
    let (_dir, trace) = fx.record(&[]);
    check_trace(&fx, &trace, &["outstanding"]);
}

/// `-O`: another allocator library. jemalloc is preloaded into the seed
/// program and probed instead of glibc's malloc: the same exact answer.
#[test]
fn seed_with_jemalloc_via_object() {
    if !common::can_record() {
        return;
    }
    let je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    assert!(
        std::path::Path::new(je).exists(),
        "libjemalloc2 is installed by scripts/setup.sh"
    );
    let fx = Fixture::load("seed");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let _guard = common::fixtures::recording_guard(false);
    let out = common::fixtures::memleak()
        .args(["record", "-q", "-O", je, "-o"])
        .arg(&trace)
        .args(["--", "env", &format!("LD_PRELOAD={je}")])
        .arg(fx.binary())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = memleak_analyze::report::analyze(&trace, &Default::default()).unwrap();
    let (user, _runtime) = fx.actual_groups(&report);
    assert_eq!(user, fx.expected_groups(&["outstanding"]));
    let t = memleak_trace::Trace::open(&trace).unwrap();
    let malloc = t.meta().counters.events.get("malloc").copied().unwrap_or(0);
    assert!(
        malloc >= 10,
        "jemalloc's malloc was probed: {malloc} events"
    );
}

/// Another recording running at the same time, of another process, puts
/// its own consumers on the same libc and libstdc++ probes. Its pid filter
/// skips this process, but its session consumers still ask the kernel for
/// the return, so foreign pending returns sit among ours (sized operator
/// delete jumps to operator delete, which jumps to free). Nesting must
/// still be found: each C++ operator and libc wrapper is one event.
/// The pids of `pid`'s children.
fn children_of(pid: u32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn beside_another_recording() {
    if !common::can_record() {
        return;
    }
    /// Ends the other recording however the test ends: its command is
    /// killed, and memleak, which waits for it, exits.
    struct Other(std::process::Child);
    impl Drop for Other {
        fn drop(&mut self) {
            for pid in children_of(self.0.id()) {
                // SAFETY: signalling the command our child started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = self.0.wait();
        }
    }
    // Declared first, dropped last: the other recording ends before the
    // guard lets a fixture that must be recorded alone start.
    let _guard = common::fixtures::recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.parquet");
    let rec = Other(
        common::fixtures::memleak()
            .args(["record", "-q", "-o"])
            .arg(&other)
            .args(["--", "sleep", "120"])
            .spawn()
            .unwrap(),
    );
    // The other recorder's child execs its command once the probes are
    // attached: wait for it to stop being a copy of memleak.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let attached = || {
        children_of(rec.0.id()).iter().any(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            comm.trim() == "sleep"
        })
    };
    while !attached() {
        assert!(
            std::time::Instant::now() < deadline,
            "the other recording did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for name in ["cxx_new", "strdup"] {
        let fx = Fixture::load(name);
        let (_dir, trace) = fx.record_unguarded(&[]);
        check_trace(&fx, &trace, &["outstanding", "mappings"]);
    }
    // The other recording is still running: the checks above ran beside it.
    assert!(attached(), "the other recording ended early");
}
