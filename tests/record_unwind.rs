//! The probe's unwinder where stacks must end early: code in an object
//! without unwind tables, code in an anonymous executable mapping, and a
//! library mapped after the recorder read the process's maps. Each stack
//! ends at the last frame it can be sure of, is marked truncated, and the
//! walk's reason is counted in meta.json; never a wrong frame.
//!
//! Needs root and a kernel with uprobe sessions, as CI has.
#![cfg(feature = "bpf")]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fixtures::{fixtures_dir_for, memleak, record_command, recording_guard, Build};
use memleak_analyze::report::{analyze, AnalyzeOptions, StackReport};

/// An outstanding stack: bytes, truncated, function names.
type Stack = (u64, bool, Vec<String>);

/// Records `unwind_edges` of `build` with `--unwind mode`; returns the
/// outstanding stacks' function names (or addresses) and truncation by
/// bytes, and meta.json's unwind counts.
fn record_edges(
    build: Build,
    mode: &str,
) -> (Vec<Stack>, memleak_trace::UnwindInfo, Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let _guard = recording_guard(false);
    let out = memleak()
        .args(["record", "-q", "--unwind", mode, "-o"])
        .arg(&trace)
        .arg("--")
        .arg(fixtures_dir_for(build).join("unwind_edges"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
    let stacks = report
        .stacks
        .iter()
        .filter(|s| s.count > 0)
        .map(|s| (s.bytes, s.truncated, names(s)))
        .collect();
    let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
    (
        stacks,
        meta.unwind.expect("unwind in meta.json"),
        meta.capture,
    )
}

fn names(s: &StackReport) -> Vec<String> {
    s.frames
        .iter()
        .map(|f| {
            f.function
                .clone()
                .unwrap_or_else(|| format!("{:#x}", f.addr))
        })
        .collect()
}

fn stack_of(stacks: &[(u64, bool, Vec<String>)], bytes: u64) -> (bool, Vec<String>) {
    let (_, truncated, names) = stacks
        .iter()
        .find(|s| s.0 == bytes)
        .unwrap_or_else(|| panic!("no stack of {bytes} bytes in {stacks:?}"));
    (*truncated, names.clone())
}

/// The anonymous mapping's stack: anon_callee, then the stub's frame in
/// the mapping, and nothing after it. Under the probes the first call met
/// a mapping made after the table was read (`no_mapping`, which asks for a
/// refresh); the second, 300 ms later, one the table knows as anonymous.
/// The agent stops for the table at once and walks again: anonymous both
/// times.
fn check_anonymous(
    stacks: &[(u64, bool, Vec<String>)],
    unwind: &memleak_trace::UnwindInfo,
    capture: Option<&str>,
) {
    let (truncated, names) = stack_of(stacks, 444);
    assert!(truncated, "{names:?}");
    assert_eq!(names.len(), 2, "{names:?}");
    assert_eq!(names[0], "anon_callee");
    assert!(names[1].starts_with("0x"), "{names:?}");
    if capture == Some("preload") {
        assert_eq!(unwind.truncated.get("anonymous"), Some(&2), "{unwind:?}");
        assert_eq!(unwind.truncated.get("no_mapping"), None, "{unwind:?}");
    } else {
        assert_eq!(unwind.truncated.get("anonymous"), Some(&1), "{unwind:?}");
        assert_eq!(unwind.truncated.get("no_mapping"), Some(&1), "{unwind:?}");
    }
}

#[test]
fn auto_steps_through_code_without_tables_by_frame_pointer() {
    if !common::can_record() {
        return;
    }
    for build in [Build::FramePointer, Build::O2] {
        let (stacks, unwind, capture) = record_edges(build, "auto");
        // libnoinfo keeps frame pointers: one frame-pointer step, then rows
        // again, to _start.
        let (truncated, names) = stack_of(&stacks, 111);
        assert!(!truncated, "{build:?}: {names:?}");
        assert_eq!(
            names[..3],
            ["noinfo_alloc", "call_noinfo", "main"],
            "{build:?}"
        );
        assert_eq!(names.last().map(String::as_str), Some("_start"));
        assert_eq!(unwind.mode, "auto");
        check_anonymous(&stacks, &unwind, capture.as_deref());
        // anonymous and no_mapping under the probes, anonymous alone under
        // the agent.
        let reasons = if capture.as_deref() == Some("preload") {
            1
        } else {
            2
        };
        assert_eq!(unwind.truncated.len(), reasons, "{build:?}: {unwind:?}");
    }
}

#[test]
fn dwarf_ends_at_code_without_tables() {
    if !common::can_record() {
        return;
    }
    let (stacks, unwind, capture) = record_edges(Build::O2, "dwarf");
    let (truncated, names) = stack_of(&stacks, 111);
    assert!(truncated);
    assert_eq!(names, ["noinfo_alloc"]);
    assert_eq!(
        unwind.truncated.get("no_unwind_info"),
        Some(&1),
        "{unwind:?}"
    );
    check_anonymous(&stacks, &unwind, capture.as_deref());
}

/// A process's state letter in /proc, None once gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Kills and waits for a child however the test ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `-p`: a library dlopened after the recorder read the maps. The walks
/// into it end with `no_mapping` until the table is refreshed; later
/// stacks through it are complete.
#[test]
fn a_library_mapped_later_is_found() {
    if !common::can_record() {
        return;
    }
    let _guard = recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let bin = fixtures_dir_for(Build::O2).join("unwind_edges");
    let mut target = Reaped(
        Command::new(&bin)
            .arg("dlopen")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = target.0.id();
    let mut lines = BufReader::new(target.0.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let rec = memleak()
        .args(["record", "-q", "-d", "4s", "-p", &pid.to_string(), "-o"])
        .arg(&trace)
        .spawn()
        .unwrap();
    let mut rec = Reaped(rec);
    // Past the BPF program's load and the table's first writing.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(rec.0.try_wait().unwrap().is_none(), "memleak ended early");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    assert_eq!(lines.next().unwrap().unwrap(), "done");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = rec.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "memleak did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    assert_ne!(proc_state(pid), Some('Z'), "the target keeps running");
    drop(target);
    let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
    let complete: Vec<Vec<String>> = report
        .stacks
        .iter()
        .filter(|s| !s.truncated)
        .map(names)
        .collect();
    assert!(
        complete.iter().any(|n| n.len() > 3
            && n[..2] == ["leaky_inner", "leaky_make"]
            && n.last().map(String::as_str) == Some("_start")),
        "{complete:?}"
    );
    // Whatever stopped early stopped at the library, for want of its
    // mapping, and says so.
    let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
    let unwind = meta.unwind.unwrap();
    for reason in unwind.truncated.keys() {
        assert_eq!(reason, "no_mapping", "{unwind:?}");
    }
    for s in report.stacks.iter().filter(|s| s.truncated) {
        assert_eq!(names(s), ["leaky_inner"]);
    }
    assert!(Path::new(&trace).exists());
}

/// A Rust release binary (rustc -O: no frame pointers, linked by the
/// toolchain's linker, whose text segment shares a file page with the
/// read-only one): the leak through three nested functions comes out
/// whole, from the allocator's caller in `leak_c` to `_start`, marked
/// complete.
#[test]
fn a_rust_release_binary_unwinds_whole() {
    if !common::can_record() || !common::has_tool("rustc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("rust_leak");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/rust_leak.rs");
    let built = Command::new("rustc")
        .args(["-O", "-g", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap();
    assert!(built.success(), "rustc failed");
    let (_trace_dir, trace) = record_command(&[bin.as_os_str()], &[]);
    let report = analyze(&trace, &AnalyzeOptions::default()).unwrap();
    // The loop in main is unrolled: one stack per call site.
    let leaks: Vec<&StackReport> = report
        .stacks
        .iter()
        .filter(|s| s.count > 0 && names(s).iter().any(|n| n == "rust_leak::leak_c"))
        .collect();
    let (bytes, count) = leaks
        .iter()
        .fold((0, 0), |(b, c), s| (b + s.bytes, c + s.count));
    assert_eq!(
        (bytes, count),
        (12_000, 3),
        "{:?}",
        leaks.iter().map(|s| names(s)).collect::<Vec<_>>()
    );
    for leak in leaks {
        assert!(!leak.truncated, "{:?}", names(leak));
        let ours: Vec<&str> = leak
            .frames
            .iter()
            .filter_map(|f| f.function.as_deref())
            .filter(|f| f.starts_with("rust_leak::"))
            .collect();
        assert_eq!(
            ours,
            [
                "rust_leak::leak_c",
                "rust_leak::leak_b",
                "rust_leak::leak_a",
                "rust_leak::main"
            ],
            "{:?}",
            names(leak)
        );
        assert_eq!(
            leak.frames.last().and_then(|f| f.function.as_deref()),
            Some("_start"),
            "{:?}",
            names(leak)
        );
    }
}
