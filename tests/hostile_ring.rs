//! A traced program that writes into the agent's shared memory itself
//! (fixtures/hostile_ring.c, issue 40): the recorder ends when the
//! command or `-d` says (it used to spin for ever), hands on nothing no
//! agent writes (other processes, kernel kinds, lifecycle events, blocks
//! past the address space, events from the future, loss counters of
//! 2^64 - 1), counts what it rejected as `corrupt_slot`, and still
//! records the program's real leaks exactly. With the real agent,
//! preloaded by `record`, and the real probes.
#![cfg(feature = "bpf")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::fixtures::{fixtures_dir, memleak, recording_guard, through};
use common::procs::wait_within;
use memleak_analyze::report::{analyze, AnalyzeOptions};

/// What `record -d 3 -- hostile_ring MODE` left: its exit status, its
/// stderr, the trace.
fn record(dir: &Path, mode: &str) -> (Option<i32>, String, PathBuf) {
    let trace = dir.join(format!("{mode}.trace"));
    let _guard = recording_guard(false);
    let mut child = memleak()
        .args(["record", "-q", "--capture", "preload", "-d", "3", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(fixtures_dir().join("hostile_ring"))
        .arg(mode)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap());
    // -d 3, the command asked to stop, the final drain: well within 30 s.
    let status = wait_within(&mut child, 30, &format!("record of hostile_ring {mode}"));
    (status.code(), reader.join().unwrap(), trace)
}

fn meta_of(trace: &Path) -> memleak_trace::Meta {
    memleak_trace::Trace::open(trace).unwrap().meta().clone()
}

fn lost(meta: &memleak_trace::Meta, reason: &str) -> u64 {
    meta.counters.lost.get(reason).copied().unwrap_or(0)
}

/// Only the command, its one exec and its one exit (the probes'), and
/// nothing of the kernel's.
fn only_the_command(meta: &memleak_trace::Meta, stderr: &str) {
    assert_eq!(meta.pids.len(), 1, "{:?}\n{stderr}", meta.pids);
    let events = &meta.counters.events;
    assert_eq!(events.get("exec"), Some(&1), "{events:?}");
    assert_eq!(events.get("exit"), Some(&1), "{events:?}");
    for kind in ["fork", "kmalloc", "kfree", "page_alloc"] {
        assert_eq!(events.get(kind), None, "{kind}: {events:?}");
    }
    // The loss counters the program wrote are not believed.
    for (reason, &n) in &meta.counters.lost {
        assert!(n < 1 << 40, "{reason} = {n}\n{stderr}");
    }
    assert!(
        stderr.contains("rejected") || stderr.contains("lost"),
        "{stderr}"
    );
}

#[test]
fn a_slot_published_with_a_wrong_sequence_is_skipped_and_the_ring_goes_on() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr, trace) = record(dir.path(), "wrong_seq");
    assert_eq!(code, Some(0), "{stderr}");
    let meta = meta_of(&trace);
    assert_eq!(lost(&meta, "corrupt_slot"), 1, "{stderr}");
    only_the_command(&meta, &stderr);
    // The leaks before the damage, and those after it: the drain went on
    // past the bad slot.
    assert_eq!(through(&trace, "leak_before"), [(1000, 1); 3]);
    assert_eq!(through(&trace, "leak_after"), [(2000, 1); 2]);
}

#[test]
fn forged_events_and_counters_are_rejected_and_counted() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr, trace) = record(dir.path(), "forge");
    assert_eq!(code, Some(0), "{stderr}");
    let meta = meta_of(&trace);
    // 9 forged events and 8 counters of 2^64 - 1.
    assert_eq!(lost(&meta, "corrupt_slot"), 9 + 8, "{stderr}");
    assert_eq!(lost(&meta, "ring_full"), 0, "{stderr}");
    only_the_command(&meta, &stderr);
    assert_eq!(through(&trace, "leak_before"), [(1000, 1); 3]);
    assert_eq!(through(&trace, "leak_after"), [(2000, 1); 2]);
    // None of the forged blocks (their frames are at 0x401000 and on).
    let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
    assert!(
        report
            .stacks
            .iter()
            .all(|s| s.bytes < 1 << 40 && s.frames.first().is_none_or(|f| f.addr != 0x401000)),
        "{:?}",
        report
            .stacks
            .iter()
            .map(|s| (s.bytes, s.count))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_scribbled_ring_ends_the_recording_and_says_so() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr, trace) = record(dir.path(), "scribble");
    assert_eq!(code, Some(0), "{stderr}");
    let meta = meta_of(&trace);
    // The 8 loss counters at least, and the slots met.
    assert!(lost(&meta, "corrupt_slot") >= 8, "{stderr}");
    only_the_command(&meta, &stderr);
}

#[test]
fn a_head_moved_by_the_program_or_a_slot_never_published_ends_at_the_duration() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Both programs sleep until the recording ends them at -d 3 (SIGTERM,
    // whose status record passes on).
    let (code, stderr, trace) = record(dir.path(), "head");
    assert_eq!(code, Some(128 + libc::SIGTERM), "{stderr}");
    let meta = meta_of(&trace);
    assert_eq!(lost(&meta, "corrupt_slot"), 1, "{stderr}");
    only_the_command(&meta, &stderr);
    assert_eq!(through(&trace, "leak_before"), [(1000, 1); 3]);

    let (code, stderr, trace) = record(dir.path(), "stuck");
    assert_eq!(code, Some(128 + libc::SIGTERM), "{stderr}");
    let meta = meta_of(&trace);
    // Its own slot, left unfinished by a process that then died.
    assert_eq!(lost(&meta, "unfinished"), 1, "{stderr}");
    assert_eq!(lost(&meta, "corrupt_slot"), 0, "{stderr}");
    only_the_command(&meta, &stderr);
    // What it published after the slot it kept is taken once it died.
    assert_eq!(through(&trace, "leak_after"), [(2000, 1); 2]);
}
