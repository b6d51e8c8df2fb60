//! `record --capture preload` against `--capture bpf` on programs the
//! in-process agent must survive: 200 forked children, a dlopened second
//! allocator, multi-threaded C++. Each is recorded both ways: the exact
//! known leaks, nothing lost, and the same outstanding allocations, stack
//! for stack, from both captures.
#![cfg(feature = "bpf")]

mod common;

use std::collections::BTreeMap;

use common::fixtures::{record_command_with, Build, Fixture, Group, RuntimeGroup};
use memleak_analyze::report::{analyze, AnalyzeOptions};

fn fixture(name: &str) -> Fixture {
    Fixture {
        name: name.to_string(),
        expected: serde_json::json!({ "program": name, "args": [] }),
        build: Build::FramePointer,
    }
}

/// One recording of `fx` with `capture` and `options`.
struct Recorded {
    user: Vec<Group>,
    runtime: Vec<RuntimeGroup>,
    meta: memleak_trace::Meta,
}

fn record(fx: &Fixture, capture: &str, options: &[&str], env: &[(String, String)]) -> Recorded {
    let mut opts = vec!["--capture", capture];
    opts.extend_from_slice(options);
    let (_dir, trace) = record_command_with(&[fx.binary().as_os_str()], env, &opts);
    let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
    assert_eq!(meta.capture.as_deref(), Some(capture));
    let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
    let (user, runtime) = fx.actual_groups(&report);
    Recorded {
        user,
        runtime,
        meta,
    }
}

/// Outstanding bytes and blocks by the innermost frame's function.
fn by_function(r: &Recorded) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for g in &r.user {
        let e = out.entry(g.frames[0].0.clone()).or_default();
        e.0 += g.bytes;
        e.1 += g.count;
    }
    out
}

fn losses(r: &Recorded) -> u64 {
    losses_of(&r.meta)
}

fn losses_of(meta: &memleak_trace::Meta) -> u64 {
    common::fixtures::lost_events(meta)
}

/// Records `fx` both ways; checks nothing was lost and the outstanding
/// allocations agree; returns the agent's recording.
fn both(fx: &Fixture, options: &[&str], env: &[(String, String)]) -> Recorded {
    let bpf = record(fx, "bpf", options, env);
    let preload = record(fx, "preload", options, env);
    assert_eq!(
        losses(&bpf),
        0,
        "{} bpf: {:?}",
        fx.name,
        bpf.meta.counters.lost
    );
    assert_eq!(
        losses(&preload),
        0,
        "{} preload: {:?}",
        fx.name,
        preload.meta.counters.lost
    );
    assert!(
        preload.user == bpf.user,
        "{}: the program's outstanding allocations differ between the captures:\n{}",
        fx.name,
        differences(&preload.user, &bpf.user)
    );
    // Two known differences (docs/accuracy.md): libc's internal mmap
    // calls (thread stacks) are not calls the agent can see, and ld.so's
    // bookkeeping for a dlopen is sized by the objects loaded, the agent
    // one of them.
    let comparable = |r: &&RuntimeGroup| {
        !r.2.iter()
            .any(|f| f == "allocate_stack" || f.contains("dl_open") || f.contains("dlopen"))
    };
    let mut a: Vec<_> = preload
        .runtime
        .iter()
        .filter(comparable)
        .map(|r| (r.0, r.1))
        .collect();
    let mut b: Vec<_> = bpf
        .runtime
        .iter()
        .filter(comparable)
        .map(|r| (r.0, r.1))
        .collect();
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "{}: runtime allocations differ between the captures",
        fx.name
    );
    preload
}

/// The groups only one capture has, a line each: what a failure prints
/// (both lists whole are too long for a CI log).
fn differences(preload: &[Group], bpf: &[Group]) -> String {
    let mut out = String::new();
    for (name, a, b) in [("preload", preload, bpf), ("bpf", bpf, preload)] {
        let mut rest: Vec<&Group> = b.iter().collect();
        for g in a {
            match rest.iter().position(|r| *r == g) {
                Some(i) => {
                    rest.swap_remove(i);
                }
                None => {
                    let frames: Vec<String> = g
                        .frames
                        .iter()
                        .map(|(f, file, line, _)| format!("{f} {file}:{line}"))
                        .collect();
                    out += &format!(
                        "  only {name}: {} B in {}: {}\n",
                        g.bytes,
                        g.count,
                        frames.join(" < ")
                    );
                }
            }
        }
    }
    out
}

#[test]
fn two_hundred_forked_children() {
    if !common::can_record() {
        return;
    }
    let fx = fixture("forks");
    let r = both(&fx, &["--follow-forks"], &[]);
    assert_eq!(r.meta.pids.len(), 201, "every child recorded");
    let f = by_function(&r);
    assert_eq!(f.get("parent_leak"), Some(&(777, 1)), "{f:?}");
    assert_eq!(f.get("child_leak"), Some(&(20_000, 200)), "{f:?}");
    assert_eq!(f.len(), 2, "{f:?}");
}

#[test]
fn a_dlopened_allocator() {
    if !common::can_record() {
        return;
    }
    if !std::path::Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2").exists() {
        common::skip("libjemalloc2 is not installed");
        return;
    }
    let fx = fixture("dl_jemalloc");
    // jemalloc's TLS is initial-exec: dlopen needs room in the static TLS.
    let env = [(
        "GLIBC_TUNABLES".to_string(),
        "glibc.rtld.optional_static_tls=16384".to_string(),
    )];
    let r = both(&fx, &[], &env);
    let f = by_function(&r);
    assert_eq!(f.get("libc_leak"), Some(&(900, 3)), "{f:?}");
    assert_eq!(f.len(), 1, "{f:?}");
}

#[test]
fn multithreaded_cxx() {
    if !common::can_record() {
        return;
    }
    let fx = fixture("cxx_threads");
    let r = both(&fx, &[], &[]);
    let f = by_function(&r);
    for k in 0..4u64 {
        assert_eq!(
            f.get(&format!("leak_{k}")),
            Some(&(24 * (k + 1), k + 1)),
            "{f:?}"
        );
    }
    assert_eq!(f.len(), 4, "{f:?}");
}

/// The ring the probes overflow (`lost_events_are_counted_and_reported`:
/// 64 KiB, drained every 200 ms) makes the agent's writers wait instead:
/// nothing lost, the exact answer.
#[test]
fn a_small_ring_makes_writers_wait_not_lose() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("threads");
    let (_dir, trace) = fx.record(&[
        "--capture",
        "preload",
        "--ring-size",
        "64k",
        "--poll-ms",
        "200",
    ]);
    common::fixtures::check_trace(&fx, &trace, &["outstanding", "mappings"]);
}

/// A program that installs a seccomp filter after it started, forbidding
/// system calls it never makes (futex, openat, getrandom, gettid, getpid,
/// kill, tgkill, rt_tgsigqueueinfo: fixtures/seccomp.c), through prctl
/// and through syscall(SYS_seccomp). The agent made a futex call to wake
/// the recorder, and the program died of SIGSYS (exit 159). It sees the
/// filter come and makes no system call since: the program ends with 0,
/// its leak is exact, and the trace says what the filter changed.
#[test]
fn a_seccomp_filter_installed_after_start_does_not_kill_the_program() {
    if !common::can_record() || !common::has_tool("cc") {
        return;
    }
    for how in ["prctl", "syscall"] {
        let fx = Fixture {
            name: "seccomp".into(),
            expected: serde_json::json!({ "program": "seccomp", "args": [how] }),
            build: Build::FramePointer,
        };
        // record_command_with asserts the command's exit status was 0.
        let (_dir, trace) = record_command_with(
            &[fx.binary().as_os_str(), how.as_ref()],
            &[],
            &["--capture", "preload"],
        );
        let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
        assert!(
            meta.notes
                .iter()
                .any(|n| n.starts_with("1 process(es) installed a seccomp filter")),
            "{how}: {:?}",
            meta.notes
        );
        // The 600,000 events of the pairs fill the ring: its writer spins
        // for room, and the recorder, polling every millisecond, makes it.
        assert_eq!(losses_of(&meta), 0, "{how}: {:?}", meta.counters.lost);
        let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
        let three: Vec<(u64, u64)> = report
            .stacks
            .iter()
            .filter(|s| {
                s.frames
                    .first()
                    .is_some_and(|f| f.function.as_deref() == Some("leak_three"))
            })
            .map(|s| (s.bytes, s.count))
            .collect();
        assert_eq!(three, [(1000, 1); 3], "{how}");
    }
}

/// A library loaded with RTLD_DEEPBIND binds malloc, free and strdup to
/// libc's, ahead of the preloaded agent (fixtures/deepbind.c, as
/// heaptrack's own dlopen test loads its library). The program's "hello"
/// freed by the library was reported lost, and the library's 3 leaks of
/// 64 bytes were never seen; the agent now patches the library's call
/// sites at its dlopen. With lazy and immediate binding, and the probes
/// for comparison: the same 3 blocks, and no free of an unknown block.
#[test]
fn a_library_loaded_with_rtld_deepbind_is_recorded_as_the_probes_see_it() {
    if !common::can_record() || !common::has_tool("cc") {
        return;
    }
    for binding in ["now", "lazy"] {
        for capture in ["preload", "bpf"] {
            let fx = Fixture {
                name: "deepbind".into(),
                expected: serde_json::json!({ "program": "deepbind", "args": [binding] }),
                build: Build::FramePointer,
            };
            let (_dir, trace) = record_command_with(
                &[fx.binary().as_os_str(), binding.as_ref()],
                &[],
                &["--capture", capture],
            );
            let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
            let what = format!("{binding}, {capture}");
            let (user, _) = fx.actual_groups(&report);
            let leaks: Vec<(String, u64, u64)> = user
                .iter()
                .map(|g| (g.frames[0].0.clone(), g.bytes, g.count))
                .collect();
            assert_eq!(leaks, [("deep_block".to_string(), 192, 3)], "{what}");
            let a = &report.summary.anomalies;
            assert_eq!(
                (a.unknown_frees, a.double_frees, a.missed_frees),
                (0, 0, 0),
                "{what}"
            );
        }
    }
}
