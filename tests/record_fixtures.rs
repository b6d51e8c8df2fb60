//! End to end: record each fixture program with the real probes, analyze
//! the trace, and compare the outstanding allocations with the fixture's
//! expected file: bytes, counts, and every frame's function and file:line.
//!
//! Needs root and a kernel with uprobe sessions, as CI has.
#![cfg(feature = "bpf")]

mod common;

use std::path::PathBuf;

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
    seed,
    realloc,
    aligned,
    mmap,
    big,
    short,
    inline,
    odd,
    threads,
    storm,
    cxx_new,
    strdup,
    dl_main,
    execer,
    fork_execer,
    deep,
    longjmp,
    sigalt,
    siglongjmp,
    seed_static,
    sighandler,
    diff_leak,
    churn
);

/// The churn fixture's allocation behaviour, recorded with the real
/// probes: by the innermost function of each of its stacks, the
/// allocations made, the temporary ones and their size buckets, exactly
/// as `behaviour` in its expected file says.
#[test]
fn churn_behaviour() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("churn");
    let (_dir, trace) = fx.record(&[]);
    let threshold = fx.expected["temporary_threshold"].as_str().unwrap();
    let opts = memleak_analyze::AnalyzeOptions {
        temporary_threshold_ns: Some(parse_ms(threshold)),
        ..Default::default()
    };
    let report = memleak_analyze::analyze(&trace, &opts).unwrap();
    for want in fx.expected["behaviour"].as_array().unwrap() {
        let function = want["function"].as_str().unwrap();
        let stacks: Vec<_> = report
            .stacks
            .iter()
            .filter(|s| {
                s.frames
                    .first()
                    .and_then(|f| f.function.as_deref())
                    .is_some_and(|f| common::fixtures::strip_params(f) == function)
            })
            .collect();
        assert!(!stacks.is_empty(), "no stack allocates in {function}");
        let allocations: u64 = stacks.iter().map(|s| s.allocations).sum();
        let temporary: u64 = stacks.iter().map(|s| s.temporary).sum();
        let mut sizes: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        for s in &stacks {
            for b in &s.allocation_sizes {
                sizes.entry(b.low).or_insert((b.high, 0)).1 += b.count;
            }
        }
        let sizes: Vec<[u64; 3]> = sizes.iter().map(|(&l, &(h, c))| [l, h, c]).collect();
        let want_sizes: Vec<[u64; 3]> = want["sizes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                let v: Vec<u64> = b
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect();
                [v[0], v[1], v[2]]
            })
            .collect();
        assert_eq!(
            (allocations, temporary, sizes),
            (
                want["allocations"].as_u64().unwrap(),
                want["temporary"].as_u64().unwrap(),
                want_sizes
            ),
            "{function}: (allocations, temporary, sizes)"
        );
    }
}

/// `100ms` -> ns (the expected file's threshold).
fn parse_ms(text: &str) -> u64 {
    text.strip_suffix("ms").unwrap().parse::<u64>().unwrap() * 1_000_000
}

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
        dl_main, execer, fork_execer, deep, longjmp, sigalt, siglongjmp, sighandler
    );
}

mod o2 {
    use super::common;
    unwound_fixture_tests!(
        common::fixtures::Build::O2;
        seed, realloc, aligned, mmap, big, short, inline, odd, threads, storm, cxx_new, strdup,
        dl_main, execer, fork_execer, deep, longjmp, sigalt, siglongjmp, sighandler
    );
}

/// The fixtures recorded by memleak's in-process agent (`--capture
/// preload`): the same expected files as the probes', frame by frame, with
/// complete stacks, and nothing lost.
mod preload {
    use super::common;
    use common::fixtures::{check_fixture_complete, Build, Fixture};

    macro_rules! preload_tests {
        ($build:expr; $($name:ident),* $(,)?) => {$(
            #[test]
            fn $name() {
                if !common::can_record() {
                    return;
                }
                let fx = Fixture::load_built(stringify!($name), $build);
                check_fixture_complete(&fx, &["--capture", "preload"]);
            }
        )*};
    }

    preload_tests!(
        Build::FramePointer;
        seed, realloc, aligned, mmap, big, short, inline, odd, threads, storm, cxx_new, strdup,
        dl_main, execer, fork_execer, deep, longjmp, sigalt, siglongjmp, sighandler, diff_leak,
        churn
    );

    mod omit_frame_pointer {
        use super::*;
        preload_tests!(
            Build::OmitFramePointer;
            seed, realloc, aligned, mmap, big, short, inline, odd, threads, storm, cxx_new,
            strdup, dl_main, execer, fork_execer, deep, longjmp, siglongjmp, sighandler
        );
    }

    mod o2 {
        use super::*;
        preload_tests!(
            Build::O2;
            seed, realloc, aligned, mmap, big, short, inline, odd, threads, storm, cxx_new,
            strdup, dl_main, execer, fork_execer, deep, longjmp, siglongjmp, sighandler
        );
    }

    /// The trace says which capture ran.
    #[test]
    fn meta_names_the_capture() {
        if !common::can_record() {
            return;
        }
        let fx = Fixture::load("seed");
        let (_dir, trace) = fx.record(&["--capture", "preload"]);
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(trace.join("meta.json")).unwrap())
                .unwrap();
        assert_eq!(meta["capture"], "preload");
        let (_dir, trace) = fx.record(&["--capture", "bpf"]);
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(trace.join("meta.json")).unwrap())
                .unwrap();
        assert_eq!(meta["capture"], "bpf");
    }
}

/// The same with the child followed: its exit is recorded, and its copies
/// of the parent's blocks are still not its leaks.
#[test]
fn fork_execer_follow_forks() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("fork_execer");
    for capture in CAPTURES {
        let (_dir, trace) = fx.record(&["--follow-forks", "--capture", capture]);
        check_trace(&fx, &trace, &["outstanding"]);
    }
}

/// Both captures, for the tests that run each.
const CAPTURES: [&str; 2] = ["bpf", "preload"];

/// With --follow-forks the child is held at fork until its probes are in
/// place, and its leaks are attributed to its own pid.
#[test]
fn forker_follow_forks() {
    if !common::can_record() {
        return;
    }
    for capture in CAPTURES {
        forker_follow_forks_by(capture);
    }
}

fn forker_follow_forks_by(capture: &str) {
    let fx = Fixture::load("forker");
    let (_dir, trace) = fx.record(&["--follow-forks", "--capture", capture]);
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
    for capture in CAPTURES {
        let (_dir, trace) = fx.record(&["--capture", capture]);
        check_trace(&fx, &trace, &["outstanding"]);
    }
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

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/// Whether jemalloc is installed; if not, says why the calling test is
/// skipped (`common::skip`).
fn has_jemalloc() -> bool {
    let there = std::path::Path::new(JEMALLOC).exists();
    if !there {
        common::skip(format_args!("{JEMALLOC} is not installed (libjemalloc2)"));
    }
    there
}

/// Records `fx` with `LD_PRELOAD=jemalloc`, given to memleak itself (the
/// command inherits it) or through `env` (a second exec); checks that the
/// trace says where the allocator came from.
fn record_with_jemalloc(fx: &Fixture, through_env: bool) -> (tempfile::TempDir, PathBuf) {
    record_with_jemalloc_by(fx, through_env, "bpf")
}

/// [`record_with_jemalloc`] with `--capture capture`. With the agent there
/// is no note: jemalloc, preloaded beside it (or by `env`, whose exec the
/// agent follows), is simply what its calls reach.
fn record_with_jemalloc_by(
    fx: &Fixture,
    through_env: bool,
    capture: &str,
) -> (tempfile::TempDir, PathBuf) {
    let _guard = common::fixtures::recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let mut cmd = common::fixtures::memleak();
    cmd.args(["record", "-q", "--capture", capture, "-o"])
        .arg(&trace)
        .arg("--");
    if through_env {
        cmd.args(["env", &format!("LD_PRELOAD={JEMALLOC}")]);
    } else {
        cmd.env("LD_PRELOAD", JEMALLOC);
    }
    let out = cmd
        .arg(fx.binary())
        .current_dir(common::fixtures::fixtures_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = memleak_trace::Trace::open(&trace).unwrap();
    assert_eq!(t.meta().capture.as_deref(), Some(capture));
    if capture == "preload" {
        return (dir, trace);
    }
    assert!(
        t.meta()
            .notes
            .iter()
            .any(|n| n.contains("malloc") && n.contains("libjemalloc.so.2")),
        "no note names jemalloc as the allocator: {:?}",
        t.meta().notes
    );
    (dir, trace)
}

/// jemalloc preloaded, no `-O`: its malloc comes first in the symbol
/// search order, and is probed once ld.so has loaded it (after the `env`
/// exec): the exact answer, every call one event.
#[test]
fn seed_with_preloaded_jemalloc() {
    if !common::can_record() || !has_jemalloc() {
        return;
    }
    let mut fx = Fixture::load("seed");
    // jemalloc links libstdc++, which allocates its emergency pool.
    fx.expected["runtime"] = Fixture::load("cxx_new").expected["runtime"].clone();
    let (_dir, trace) = record_with_jemalloc(&fx, true);
    check_trace(&fx, &trace, &["outstanding", "mappings"]);
}

/// jemalloc exports operator new and new[] as well: the C++ fixture's
/// new[] leaks (856 of its 976 bytes) are jemalloc's and were missed
/// when only libstdc++'s operators were probed.
#[test]
fn cxx_new_with_preloaded_jemalloc() {
    if !common::can_record() || !has_jemalloc() {
        return;
    }
    let fx = Fixture::load("cxx_new");
    let (_dir, trace) = record_with_jemalloc(&fx, false);
    check_trace(&fx, &trace, &["outstanding", "mappings"]);
}

/// Under the agent, jemalloc preloaded beside it, and preloaded by `env`
/// (the agent follows that exec): the same exact answers.
#[test]
fn preloaded_jemalloc_under_the_agent() {
    if !common::can_record() || !has_jemalloc() {
        return;
    }
    let fx = Fixture::load("cxx_new");
    let (_dir, trace) = record_with_jemalloc_by(&fx, false, "preload");
    check_trace(&fx, &trace, &["outstanding", "mappings"]);
    let mut fx = Fixture::load("seed");
    fx.expected["runtime"] = Fixture::load("cxx_new").expected["runtime"].clone();
    let (_dir, trace) = record_with_jemalloc_by(&fx, true, "preload");
    check_trace(&fx, &trace, &["outstanding", "mappings"]);
}

/// A program the agent cannot enter (a static one, executed by `env`)
/// is recorded by the probes from its exec on, with a note: the exact
/// answer still.
#[test]
fn exec_of_a_static_program_under_the_agent() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("seed_static");
    let (_dir, trace) = common::fixtures::record_command_with(
        &[std::ffi::OsStr::new("env"), fx.binary().as_os_str()],
        &[],
        &["--capture", "preload"],
    );
    check_trace(&fx, &trace, &["outstanding"]);
    assert_noted_without_agent(&memleak_trace::Trace::open(&trace).unwrap().meta().clone());
}

/// The trace says that a process ran without the agent.
fn assert_noted_without_agent(meta: &memleak_trace::Meta) {
    assert!(
        meta.notes
            .iter()
            .any(|n| n.contains("without memleak's agent")),
        "{:?}",
        meta.notes
    );
}

/// A dynamic program executed behind the agent's back (a raw execve
/// system call) is recorded by the probes, loaded only then, and its
/// stacks, which have no frame pointers, are unwound with the rows of
/// objects the recording had placed before the probes existed (libc's,
/// for the program that executed it): complete and exact.
#[test]
fn exec_without_the_agent_unwinds_with_the_rows_placed_before() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("nofp");
    let (_dir, trace) = common::fixtures::record_command_with(
        &[
            fx.binary().with_file_name("raw_exec").as_os_str(),
            fx.binary().as_os_str(),
        ],
        &[],
        &["--capture", "preload"],
    );
    assert_noted_without_agent(&check_nofp_unwound(&fx, &trace));
}

/// A frame prints as `function+0xOFFSET`, where OFFSET is the return
/// address's offset into the function: the function's start is what
/// `readelf -s` says of the symbol, in the fixture and in libc. glibc's
/// `__pthread_create_2_1`, which maps the stacks of the fixture's threads,
/// is split into a hot and a cold part (DWARF `DW_AT_ranges`); its offset
/// used to be printed as the address's offset in the file.
#[test]
fn frame_offsets_are_offsets_into_the_function() {
    if !common::can_record() || !common::has_tool("readelf") {
        return;
    }
    let fx = Fixture::load("threads");
    let (_dir, trace) = fx.record(&[]);
    let all = memleak_analyze::report::AnalyzeOptions {
        top: 0,
        ..Default::default()
    };
    let report = memleak_analyze::report::analyze(&trace, &all).unwrap();
    let text = memleak_analyze::text::render(&report);
    let mut elfs = common::elfsyms::ElfSymsCache::default();
    let mut checked = std::collections::BTreeSet::new();
    let mut libc = None;
    for f in report
        .stacks
        .iter()
        .filter(|s| !s.kernel && s.count > 0)
        .flat_map(|s| &s.frames)
    {
        let (Some(func), Some(path), Some(file_offset)) =
            (f.function.as_deref(), f.path.as_deref(), f.file_offset)
        else {
            continue;
        };
        if path.contains("/libc.so") {
            libc = Some(path.to_string());
        }
        let elf = elfs.get(path);
        let (ret, _) = elf.vaddr(file_offset).expect("the address is in a segment");
        let named = elf.functions_named(func);
        if named.is_empty() {
            continue; // a name readelf does not list (a DWARF-only one)
        }
        let off = f
            .offset
            .unwrap_or_else(|| panic!("{func} at {path}+{file_offset:#x} has no offset"));
        assert!(
            named.iter().any(|s| s.value + off == ret && off <= s.size),
            "{func}+{off:#x} (return address {ret:#x} in {path}): readelf says {named:?}"
        );
        assert!(
            text.contains(&format!("{func}+{off:#x}")),
            "the text report prints {func}+{off:#x}"
        );
        checked.insert(func.to_string());
    }
    for f in ["leak_t0", "leak_t3", "worker", "start_thread"] {
        assert!(checked.contains(f), "{f} checked: {checked:?}");
    }
    let libc = libc.expect("frames in libc");
    if elfs.get(&libc).has_debug_file {
        assert!(
            checked.contains("__pthread_create_2_1"),
            "the thread stack's mmap checked: {checked:?}"
        );
    } else {
        eprintln!("libc's debug symbols are not installed: __pthread_create_2_1 not checked");
    }
}

/// Code without frame pointers leaves %rbp pointing at data, and the
/// frame-pointer walk reads return addresses there: a pointer into a
/// table in .rodata, ASCII text, a pointer into .text between functions
/// or into a function but after no call. None of them is a frame. Each stack must end before the first one,
/// marked truncated and counted in meta.json, what is left must be the
/// true stack's beginning, and every frame must be named by the function
/// symbol containing it (never by a data object), at the right offset.
#[test]
fn nofp_data_is_not_a_frame() {
    if !common::can_record() || !common::has_tool("readelf") {
        return;
    }
    let fx = Fixture::load("nofp");
    // The frame-pointer walk's: unwound with the program's .eh_frame (the
    // default) these stacks are complete (nofp_unwound).
    let (_dir, trace) = fx.record(&["--unwind", "fp"]);
    let report = memleak_analyze::report::analyze(&trace, &Default::default()).unwrap();
    let (user, runtime) = fx.actual_groups(&report);
    assert!(runtime.is_empty(), "{runtime:?}");
    let expected = fx.expected_groups(&["outstanding"]);
    assert_eq!(user.len(), expected.len(), "{user:?}");
    for want in &expected {
        let got = user
            .iter()
            .find(|g| (g.bytes, g.count) == (want.bytes, want.count))
            .unwrap_or_else(|| panic!("no stack of {} bytes: {user:?}", want.bytes));
        assert!(
            !got.frames.is_empty() && want.frames.starts_with(&got.frames),
            "{:?} is not the beginning of {:?}",
            got.frames,
            want.frames
        );
    }
    let mut elfs = common::elfsyms::ElfSymsCache::default();
    let mut stacks = Vec::new();
    for s in report.stacks.iter().filter(|s| s.count > 0) {
        assert!(s.truncated, "stack {} is not marked truncated", s.stack_id);
        let mut names = Vec::new();
        for f in &s.frames {
            let where_ = format!("{:#x} in stack {}", f.addr, s.stack_id);
            let (Some(path), Some(file_offset)) = (f.path.as_deref(), f.file_offset) else {
                panic!("{where_}: a frame in no object: {f:?}");
            };
            let elf = elfs.get(path);
            let (ret, exec) = elf.vaddr(file_offset).expect("in a segment");
            assert!(exec, "{where_}: a frame outside code: {f:?}");
            let func = f.function.as_deref().unwrap_or("??");
            let containing = elf.functions_at(ret - 1);
            assert!(
                containing
                    .iter()
                    .any(|s| s.name == func && Some(ret - s.value) == f.offset),
                "{where_}: {func}+{:?}, but the function symbols there are {containing:?}",
                f.offset
            );
            names.push(func.to_string());
        }
        stacks.push(names);
    }
    stacks.sort();
    assert_eq!(
        stacks,
        [
            vec!["leak_ascii"],
            vec!["leak_frame", "with_rbp"],
            vec!["leak_midcall"],
            vec!["leak_rodata"],
            vec!["leak_text"],
        ]
    );
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(trace.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["cut_stacks"], 5, "stacks cut, in meta.json");
}

/// The same program unwound with its .eh_frame (the default): whatever
/// %rbp points at is never read, and each stack is the true one, complete:
/// the expected file's, with the assembly function between the leak and
/// its caller that valgrind does not name (with_rbp, no line information).
#[test]
fn nofp_unwound() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("nofp");
    let (_dir, trace) = fx.record(&[]);
    check_nofp_unwound(&fx, &trace);
}

/// The nofp fixture's stacks are complete and exact (see `nofp_unwound`);
/// returns the trace's meta.
fn check_nofp_unwound(fx: &Fixture, trace: &std::path::Path) -> memleak_trace::Meta {
    let report = memleak_analyze::report::analyze(trace, &Default::default()).unwrap();
    let (mut user, runtime) = fx.actual_groups(&report);
    assert!(runtime.is_empty(), "{runtime:?}");
    for g in &mut user {
        assert_eq!(g.frames[1].0, "with_rbp", "{g:?}");
        g.frames.remove(1);
    }
    assert_eq!(user, fx.expected_groups(&["outstanding"]));
    assert!(report.stacks.iter().all(|s| !s.truncated));
    let meta = memleak_trace::Trace::open(trace).unwrap().meta().clone();
    assert_eq!(meta.cut_stacks, Some(0));
    assert_eq!(
        meta.unwind.as_ref().map(|u| u.complete),
        Some(5),
        "{:?}",
        meta.unwind
    );
    meta
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
            .args([
                "record",
                "-q",
                "--capture",
                "bpf",
                "--shared-libraries",
                "-o",
            ])
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
        // On the system's files, shared with the other recording (a
        // command's private copies would share nothing with it).
        let (_dir, trace) = fx.record_unguarded(&["--capture", "bpf", "--shared-libraries"]);
        check_trace(&fx, &trace, &["outstanding", "mappings"]);
    }
    // The other recording is still running: the checks above ran beside it.
    assert!(attached(), "the other recording ended early");
}

/// A followed child that executes a program whose allocator nothing has
/// probed yet: a static one (seed_static), the shell's children under
/// `--follow-forks`. Its allocator was searched for after an exec of the
/// command only: the children were recorded with the shell's libc
/// probes, which a static program never calls (0 of their leaks). Each
/// child's leak, 5 blocks of 4 bytes from alloc_v3, is now recorded, with
/// both captures.
#[test]
fn followed_children_that_execute_a_static_program() {
    if !common::can_record() {
        return;
    }
    let prog = common::fixtures::fixtures_dir().join("seed_static");
    let script = format!("{p}; {p}; true", p = prog.display());
    for capture in CAPTURES {
        let (_dir, trace) = common::fixtures::record_command_with(
            &["/bin/sh".as_ref(), "-c".as_ref(), script.as_ref()],
            &[],
            &["--follow-forks", "--capture", capture],
        );
        let report = memleak_analyze::report::analyze(
            &trace,
            &memleak_analyze::report::AnalyzeOptions::default(),
        )
        .unwrap();
        let mut by_pid: Vec<(u64, u64)> = report
            .stacks
            .iter()
            .filter(|s| {
                s.frames
                    .first()
                    .is_some_and(|f| f.function.as_deref() == Some("alloc_v3"))
            })
            .map(|s| (s.bytes, s.count))
            .collect();
        by_pid.sort();
        assert_eq!(by_pid, [(20, 5), (20, 5)], "{capture}");
    }
}
