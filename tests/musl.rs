//! Programs linked with musl, as on Alpine (issue 40, item 6), under each
//! capture. A dynamically linked musl program's allocator is in its
//! loader, `/lib/ld-musl-x86_64.so.1`, which is also its libc: the probes
//! go there, at its exec (no stop of memleak's comes before it runs), and
//! record its leaks exactly. memleak's agent, built with glibc, loads in
//! it too (it needs nothing from glibc that musl lacks), records the same
//! leaks, and is what `auto` takes. A static musl program is
//! its own allocator, probed as a static glibc program is. And a program
//! whose malloc memleak found only at its exit (a loader memleak does not
//! stop in) was said to have run unrecorded: the stops now go in each
//! process's own loader, and it is recorded.
//! The real probes and the real agent, programs built here with musl-gcc.
#![cfg(feature = "bpf")]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::fixtures::{lost_events, memleak, recording_guard, through};

/// Leaks 3 × 1000 bytes from `leak_three`, 5 × 100 from `leak_calloc` and
/// 3000 (a realloc of 10) from `leak_realloc`; `churn` frees its 100
/// blocks. musl's own start-up and exit make no heap call: every event is
/// the program's.
const PROGRAM: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *volatile sink;

__attribute__((noinline)) void leak_three(void)
{
	for (int i = 0; i < 3; i++) {
		char *p = malloc(1000);
		memset(p, i, 1000);
		sink = p;
	}
}

__attribute__((noinline)) void leak_calloc(void)
{
	sink = calloc(5, 100);
}

__attribute__((noinline)) void leak_realloc(void)
{
	char *p = malloc(10);
	sink = realloc(p, 3000);
}

__attribute__((noinline)) void churn(void)
{
	for (int i = 0; i < 100; i++) {
		void *p = malloc(64 + i);
		sink = p;
		free(p);
	}
}

int main(void)
{
	leak_three();
	leak_calloc();
	leak_realloc();
	churn();
	puts("done");
	return 0;
}
"#;

/// The program's heap events, every one of them.
const EVENTS: [(&str, u64); 4] = [
    ("malloc", 104),
    ("calloc", 1),
    ("realloc", 1),
    ("free", 100),
];

/// The program built into `dir` by `cc` with `flags`.
fn build(dir: &Path, cc: &str, name: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join("program.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.join(name);
    let out = Command::new(cc)
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(flags)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc} {flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// `record -o DIR/t.trace OPTIONS -- EXE` to its end: its output, and the
/// trace.
fn record(dir: &Path, exe: &Path, options: &[&str]) -> (Output, PathBuf) {
    let trace = dir.join("t.trace");
    let _ = std::fs::remove_dir_all(&trace);
    let _guard = recording_guard(false);
    let out = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .args(options)
        .arg("--")
        .arg(exe)
        .output()
        .unwrap();
    (out, trace)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The program ran to its end, recorded by `capture`: every heap event,
/// nothing lost, its leaks exactly, and nothing more from it.
fn recorded_exactly(out: &Output, trace: &Path, capture: &str) {
    let err = stderr(out);
    assert!(out.status.success(), "{:?}\n{err}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n", "{err}");
    assert!(!err.contains("warning"), "{err}");
    let meta = memleak_trace::Trace::open(trace).unwrap().meta().clone();
    assert_eq!(meta.capture.as_deref(), Some(capture));
    assert_eq!(lost_events(&meta), 0, "{:?}", meta.counters.lost);
    for (kind, n) in EVENTS {
        assert_eq!(
            meta.counters.events.get(kind),
            Some(&n),
            "{kind}: {:?}",
            meta.counters.events
        );
    }
    assert_eq!(through(trace, "leak_three"), [(3000, 3)]);
    assert_eq!(through(trace, "leak_calloc"), [(500, 1)]);
    assert_eq!(through(trace, "leak_realloc"), [(3000, 1)]);
    assert_eq!(through(trace, "churn"), []);
    let (bytes, count) = through(trace, "main")
        .iter()
        .fold((0, 0), |(b, c), s| (b + s.0, c + s.1));
    assert_eq!((bytes, count), (6500, 5));
}

/// A dynamically linked musl program, and its loader.
fn dynamic(dir: &Path) -> (PathBuf, String) {
    let exe = build(dir, "musl-gcc", "dynamic", &[]);
    let data = std::fs::read(&exe).unwrap();
    let ld = "/lib/ld-musl-x86_64.so.1";
    assert!(
        data.windows(ld.len()).any(|w| w == ld.as_bytes()),
        "{} is not run by {ld}",
        exe.display()
    );
    (exe, ld.to_string())
}

fn can_build_musl() -> bool {
    common::can_record() && common::has_tool("musl-gcc")
}

#[test]
fn the_probes_record_a_dynamic_musl_program_in_its_loader() {
    if !can_build_musl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (exe, _) = dynamic(dir.path());
    let (out, trace) = record(dir.path(), &exe, &["--capture", "bpf"]);
    recorded_exactly(&out, &trace, "bpf");
}

/// memleak's agent in a musl program: preloaded by musl's loader, it
/// records the leaks exactly, and `auto` takes it. It needed
/// `__register_atfork`, which musl lacks: the loader refused to start the
/// program (exit status 127, the user's command never ran).
#[test]
fn the_agent_records_a_dynamic_musl_program() {
    if !can_build_musl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (exe, _) = dynamic(dir.path());
    let (out, trace) = record(dir.path(), &exe, &["--capture", "preload"]);
    recorded_exactly(&out, &trace, "preload");
    let (out, trace) = record(dir.path(), &exe, &[]);
    recorded_exactly(&out, &trace, "preload");
}

#[test]
fn a_static_musl_program_is_recorded_by_the_probes_in_it() {
    if !can_build_musl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "musl-gcc", "static", &["-static"]);
    for options in [&["--capture", "bpf"][..], &[]] {
        let (out, trace) = record(dir.path(), &exe, options);
        recorded_exactly(&out, &trace, "bpf");
    }
    let (out, _) = record(dir.path(), &exe, &["--capture", "preload"]);
    assert_eq!(
        common::one_line_error(&out),
        format!(
            "memleak: error: --capture preload: {} is statically linked: nothing can be preloaded",
            exe.display()
        )
    );
}

/// A glibc program run by a copy of ld.so, with a copy of libc (as a
/// program from another distribution's tree, or Nix's, is): memleak's
/// `_dl_debug_state` stops were in this system's ld.so only, so its malloc
/// was found at its exit, and none of its heap was recorded (a loss,
/// `unprobed_process`). The stops now go in each process's own loader,
/// the object at its `AT_BASE`: its leaks are recorded exactly.
#[test]
fn a_program_with_a_loader_of_its_own_is_recorded() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let libs = dir.path().join("lib");
    std::fs::create_dir(&libs).unwrap();
    for (from, to) in [
        ("/lib64/ld-linux-x86-64.so.2", "ld-linux-x86-64.so.2"),
        ("/lib/x86_64-linux-gnu/libc.so.6", "libc.so.6"),
    ] {
        common::copy_executable(std::path::Path::new(from), &libs.join(to));
    }
    let exe = build(
        dir.path(),
        "cc",
        "foreign",
        &[
            &format!(
                "-Wl,--dynamic-linker={}",
                libs.join("ld-linux-x86-64.so.2").display()
            ),
            &format!("-Wl,-rpath,{}", libs.display()),
        ],
    );
    let (out, trace) = record(dir.path(), &exe, &["--capture", "bpf"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{:?}\n{err}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n", "{err}");
    assert!(!err.contains("warning"), "{err}");
    let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
    assert_eq!(lost_events(&meta), 0, "{:?}", meta.counters.lost);
    assert_eq!(through(&trace, "leak_three"), [(3000, 3)]);
    assert_eq!(through(&trace, "leak_calloc"), [(500, 1)]);
    assert_eq!(through(&trace, "leak_realloc"), [(3000, 1)]);
}
