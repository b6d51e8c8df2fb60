//! `memleak diff` end to end, on real recordings of `fixtures/diff_leak.c`
//! built several ways, each from its own copy of the sources in its own
//! temporary directory (so the builds' source paths differ too):
//! the same program built twice with its code at other addresses shows no
//! change on any stack, and the fixed build against the unfixed one shows
//! exactly the leak the fix removed, and nothing else.
//!
//! Needs root and a kernel with uprobe sessions, as CI has.
#![cfg(feature = "bpf")]

mod common;

use std::path::{Path, PathBuf};

use common::fixtures::{build_diff_leak as build_with, memleak, record_command};

/// diff_leak.c built with `defines` ([`build_with`] without a prefix).
fn build(defines: &[&str]) -> (tempfile::TempDir, PathBuf) {
    build_with(defines, "")
}
use serde_json::Value;

fn record(bin: &Path) -> (tempfile::TempDir, PathBuf) {
    record_command(&[bin.as_os_str()], &[])
}

/// Runs `memleak diff`, which must succeed.
fn run_diff(base: &Path, new: &Path, extra: &[&str]) -> std::process::Output {
    let out = memleak()
        .arg("diff")
        .arg(base)
        .arg(new)
        .args(["-q", "-T", "0"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "memleak diff {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `memleak diff` and returns its stdout.
fn diff(base: &Path, new: &Path, extra: &[&str]) -> String {
    String::from_utf8(run_diff(base, new, extra).stdout).unwrap()
}

fn diff_json(base: &Path, new: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["--format", "json"];
    args.extend(extra);
    serde_json::from_str(&diff(base, new, &args)).unwrap()
}

/// The entry whose innermost frame is `function`.
fn entry<'a>(d: &'a Value, function: &str) -> &'a Value {
    d["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["frames"][0]["function"] == function)
        .unwrap_or_else(|| panic!("no stack from {function} in {d:#}"))
}

/// (bytes, count) of one side of an entry.
fn side(e: &Value, which: &str) -> (u64, u64) {
    (
        e[which]["bytes"].as_u64().unwrap(),
        e[which]["count"].as_u64().unwrap(),
    )
}

/// The program's leaking stack in a trace: its innermost frame's address
/// and source file.
fn leak_frame(trace: &Path) -> (u64, String) {
    let r = memleak_analyze::analyze(trace, &Default::default()).unwrap();
    let s = r
        .stacks
        .iter()
        .find(|s| s.count > 0 && s.frames[0].function.as_deref() == Some("leak_path"))
        .expect("leak_path leaks");
    (
        s.frames[0].addr,
        s.frames[0].file.clone().unwrap_or_default(),
    )
}

#[test]
fn same_program_built_twice_shows_no_change() {
    if !common::can_record() {
        return;
    }
    let (_a, bin_a) = build(&[]);
    let (_b, bin_b) = build(&["-DPAD"]);
    let (_ta, trace_a) = record(&bin_a);
    let (_tb, trace_b) = record(&bin_b);
    // What the diff must see through: other addresses, other source paths.
    let (addr_a, file_a) = leak_frame(&trace_a);
    let (addr_b, file_b) = leak_frame(&trace_b);
    assert_ne!(addr_a, addr_b, "the padded build moved no code");
    assert_ne!(file_a, file_b, "both builds have the same source path");

    let d = diff_json(&trace_a, &trace_b, &[]);
    let s = &d["summary"];
    for k in ["grown", "shrunk", "only_in_base", "only_in_new"] {
        assert_eq!(s[k], 0, "{k} in {d:#}");
    }
    assert_eq!(s["delta_bytes"], 0);
    assert_eq!(s["delta_allocations"], 0);
    assert_eq!(
        s["base"]["outstanding_bytes"],
        s["new"]["outstanding_bytes"]
    );
    let stacks = d["stacks"].as_array().unwrap();
    assert_eq!(s["unchanged"], stacks.len() as u64);
    for e in stacks {
        assert_eq!(e["change"], "unchanged", "{e:#}");
        assert_eq!(side(e, "base"), side(e, "new"), "{e:#}");
        assert_eq!(e["delta_bytes"], 0);
    }
    // Both of the program's stacks were matched, with their exact sizes.
    assert_eq!(side(entry(&d, "leak_path"), "new"), (336, 7));
    assert_eq!(side(entry(&d, "cache_fill"), "new"), (300, 3));
    assert_eq!(entry(&d, "leak_path")["frames"][1]["function"], "main");

    // The text says so too.
    let text = diff(&trace_a, &trace_b, &[]);
    assert!(text.contains("Grown: no stacks."), "{text}");
    assert!(text.contains("Shrunk: no stacks."), "{text}");
}

#[test]
fn fixed_build_shows_exactly_the_leak() {
    if !common::can_record() {
        return;
    }
    let (_a, unfixed) = build(&[]);
    let (_b, fixed) = build(&["-DFIXED"]);
    let (_ta, before) = record(&unfixed);
    let (_tb, after) = record(&fixed);

    // BASE leaks, NEW is fixed: the leak is the one change.
    let d = diff_json(&before, &after, &[]);
    let s = &d["summary"];
    assert_eq!(s["delta_bytes"], -336, "{d:#}");
    assert_eq!(s["delta_allocations"], -7);
    assert_eq!(s["shrunk"], 1);
    assert_eq!(s["grown"], 0);
    assert_eq!(s["only_in_base"], 1);
    assert_eq!(s["only_in_new"], 0);
    let stacks = d["stacks"].as_array().unwrap();
    let changed: Vec<&Value> = stacks
        .iter()
        .filter(|e| e["change"] != "unchanged")
        .collect();
    assert_eq!(changed.len(), 1, "{d:#}");
    let leak = changed[0];
    assert_eq!(leak["frames"][0]["function"], "leak_path");
    assert_eq!(leak["frames"][0]["line"], 29);
    assert_eq!(leak["frames"][1]["function"], "main");
    assert_eq!(leak["frames"][1]["line"], 46);
    assert_eq!(leak["change"], "shrunk");
    assert_eq!(side(leak, "base"), (336, 7));
    assert_eq!(side(leak, "new"), (0, 0));
    assert_eq!(
        (leak["delta_bytes"].clone(), leak["delta_count"].clone()),
        (Value::from(-336), Value::from(-7))
    );
    assert_eq!(side(entry(&d, "cache_fill"), "base"), (300, 3));
    assert_eq!(side(entry(&d, "cache_fill"), "new"), (300, 3));

    // The other way round, the leak is new.
    let r = diff_json(&after, &before, &[]);
    assert_eq!(r["summary"]["delta_bytes"], 336);
    assert_eq!(r["summary"]["grown"], 1);
    assert_eq!(r["summary"]["shrunk"], 0);
    assert_eq!(r["summary"]["only_in_new"], 1);
    assert_eq!(r["stacks"][0]["frames"][0]["function"], "leak_path");
    assert_eq!(r["stacks"][0]["change"], "grown");

    // Each side's own process: the same diff. --pid alone names a process
    // of one recording, and selects nothing in the other.
    let pid = |t: &Path| memleak_trace::Trace::open(t).unwrap().meta().pids[0].to_string();
    let (pb, pn) = (pid(&before), pid(&after));
    let by_pid = diff_json(&before, &after, &["--base-pid", &pb, "--new-pid", &pn]);
    assert_eq!(by_pid["stacks"], d["stacks"]);
    let one = diff_json(&before, &after, &["--pid", &pb]);
    assert_eq!(one["summary"]["new"]["outstanding_bytes"], 0);
    assert_eq!(one["summary"]["only_in_new"], 0);

    // Text: the leak is listed under Shrunk with its change.
    let text = diff(&before, &after, &[]);
    assert!(text.contains("Grown: no stacks."), "{text}");
    assert!(
        text.contains(
            "-336 bytes, -7 allocations: 336 -> 0 bytes in 7 -> 0 allocations [gone in NEW]"
        ),
        "{text}"
    );
    // Folded: the differential columns, BASE then NEW.
    let folded = diff(&before, &after, &["--format", "folded"]);
    assert!(
        folded
            .lines()
            .any(|l| l.ends_with(";main;leak_path 336 0") || l == "main;leak_path 336 0"),
        "{folded}"
    );
    assert!(
        folded
            .lines()
            .any(|l| l.ends_with("main;cache_fill 300 300")),
        "{folded}"
    );
    let svg = diff(&before, &after, &["--format", "svg", "--base-widths"]);
    assert!(
        svg.contains("leak_path"),
        "the leak is drawn with BASE's widths"
    );
}

/// Runs `memleak diff` and returns its stderr.
fn diff_stderr(base: &Path, new: &Path, extra: &[&str]) -> String {
    String::from_utf8(run_diff(base, new, extra).stderr).unwrap()
}

#[test]
fn moved_lines_get_a_hint_of_ignore_lines() {
    if !common::can_record() {
        return;
    }
    let (_a, bin_a) = build(&[]);
    // Three lines more at the top: every call is three lines further down.
    let (_b, bin_b) = build_with(&[], "/* moved */\n\n\n");
    let (_ta, trace_a) = record(&bin_a);
    let (_tb, trace_b) = record(&bin_b);

    // Matched by lines, both stacks read as gone and new.
    let d = diff_json(&trace_a, &trace_b, &[]);
    assert_eq!(d["summary"]["only_in_base"], 2, "{d:#}");
    assert_eq!(d["summary"]["only_in_new"], 2, "{d:#}");
    let e = diff_stderr(&trace_a, &trace_b, &[]);
    assert!(
        e.contains(
            "memleak: hint: 2 of the 2 stacks only in BASE match a stack of NEW when line \
             numbers are ignored"
        ) && e.contains("try --ignore-lines"),
        "{e}"
    );
    // With it, they match, and there is nothing to hint.
    let d = diff_json(&trace_a, &trace_b, &["--ignore-lines"]);
    assert_eq!(d["summary"]["only_in_base"], 0, "{d:#}");
    assert!(diff_stderr(&trace_a, &trace_b, &["--ignore-lines"]).is_empty());
    // Nor for a change that moved nothing: the fix of the leak.
    let (_c, fixed) = build(&["-DFIXED"]);
    let (_tc, trace_c) = record(&fixed);
    assert!(!diff_stderr(&trace_a, &trace_c, &[]).contains("hint"));
}
