//! End to end: a recording that loses events says so everywhere. A
//! workload of 2,000,000 malloc+free pairs and 2,000 leaks of 64 bytes
//! (bench/alloc_pairs.c), recorded with the smallest ring buffer, loses
//! events to a full ring; `record`, `analyze` (stderr, text, JSON, HTML,
//! pprof) and `diff` warn that its figures are uncertain, and
//! `--fail-on-loss` turns that into exit status 3 after the report is
//! written. The same workload, smaller and recorded with the default ring,
//! loses nothing, reports the truth (128,000 bytes in 2,000 blocks) and
//! warns of nothing.
//!
//! Needs root (recording), gcc, and python3 with `google.protobuf` and
//! protoc for the pprof decoder (as tests/pprof.rs).
#![cfg(feature = "bpf")]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::fixtures::{memleak, recording_guard, root};
use serde_json::Value;

/// bench/alloc_pairs.c, built into `dir`.
fn alloc_pairs(dir: &Path) -> PathBuf {
    let bin = dir.join("alloc_pairs");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(root().join("bench/alloc_pairs.c"))
        .status()
        .expect("gcc runs");
    assert!(status.success(), "building alloc_pairs failed");
    bin
}

/// Records `bin PAIRS 2000` with `extra` options; returns the trace and
/// `record`'s stderr.
fn record(dir: &Path, bin: &Path, pairs: &str, extra: &[&str]) -> (PathBuf, String) {
    let trace = dir.join(format!("pairs-{pairs}.parquet"));
    let out = {
        let _guard = recording_guard(false);
        memleak()
            .args(["record", "-q", "--capture", "bpf", "-o"])
            .arg(&trace)
            .args(extra)
            .arg("--")
            .arg(bin)
            .args([pairs, "2000"])
            .output()
            .unwrap()
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "record failed: {stderr}");
    (trace, stderr)
}

/// Runs `memleak ARGS` to completion.
fn run(args: &[&str]) -> Output {
    memleak().args(args).output().unwrap()
}

/// `analyze -q T --format FORMAT -o PATH`, which must succeed.
fn analyze_to(t: &str, format: &str, path: &std::path::Path) {
    let out = run(&[
        "analyze",
        "-q",
        t,
        "--format",
        format,
        "-o",
        path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The lines of `text` that start with `prefix`.
fn lines_with<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

/// The comments of a gzipped pprof profile, decoded by protobuf's Python
/// package (tests/python/read_pprof.py), not by memleak.
fn pprof_comments(profile: &Path) -> Vec<String> {
    let out = Command::new("python3")
        .arg(root().join("tests/python/read_pprof.py"))
        .arg(profile)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "read_pprof.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    p["comments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect()
}

fn analyze_json(trace: &str) -> (Value, Output) {
    let out = run(&["analyze", "-q", trace, "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    (serde_json::from_slice(&out.stdout).unwrap(), out)
}

#[test]
fn a_full_ring_makes_every_output_warn_and_fail_on_loss_exit_3() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = alloc_pairs(dir.path());
    let (trace, rec_err) = record(dir.path(), &bin, "2000000", &["--ring-size", "4k"]);
    let meta = memleak_trace::Meta::load(&trace).unwrap();
    let lost = meta.counters.lost.get("ring_full").copied().unwrap_or(0);
    assert!(
        lost > 0,
        "the 64 KiB ring lost nothing: the test's premise failed ({:?})",
        meta.counters.lost
    );
    let warning =
        format!("{lost} events lost (ring buffer full): outstanding figures are uncertain");

    // record: one warning line, with a ring 4 times as large to try.
    assert_eq!(
        lines_with(&rec_err, "memleak: warning:"),
        [format!(
            "memleak: warning: {warning}; record with --ring-size 256k \
             (4 times the 64 KiB used) to lose fewer"
        )],
        "{rec_err}"
    );

    let t = trace.to_str().unwrap();
    // analyze, text: the report leads with it, stderr has it once, and
    // the exit status is 0.
    let out = run(&["analyze", "-q", t]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(text.lines().next(), Some(&*format!("WARNING: {warning}.")));
    assert_eq!(
        lines_with(&stderr_of(&out), "memleak: warning:"),
        [format!("memleak: warning: {warning}")]
    );

    // JSON.
    let (json, _) = analyze_json(t);
    let s = &json["summary"];
    assert_eq!(s["uncertain"], true);
    assert_eq!(s["lost_events"]["missing"], lost);
    assert_eq!(s["lost_events"]["by_reason"]["ring_full"], lost);
    assert_eq!(s["lost_events"]["warning"], warning.as_str());
    eprintln!(
        "{lost} events lost: reported {} bytes in {} blocks, truth 128000 in 2000",
        s["outstanding_bytes"], s["outstanding_allocations"]
    );

    // HTML: a banner at the top, before the summary.
    let html = dir.path().join("report.html");
    analyze_to(t, "html", &html);
    let page = std::fs::read_to_string(&html).unwrap();
    let banner = page.find("id=\"lost-events\"").expect("a loss banner");
    assert!(banner < page.find("<section id=\"summary\">").unwrap());
    assert!(page.contains(&format!("{lost} events lost (ring buffer full)")));

    // pprof: a comment `go tool pprof -raw` and `-comments` show.
    let profile = dir.path().join("profile.pb.gz");
    analyze_to(t, "pprof", &profile);
    assert!(
        pprof_comments(&profile).contains(&format!("WARNING: {warning}")),
        "{:?}",
        pprof_comments(&profile)
    );

    // --fail-on-loss: status 3, the report written all the same.
    let out = run(&["analyze", "-q", t, "--fail-on-loss"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert_eq!(out.stdout, text.as_bytes());

    // diff: either side's losses; the clean side says nothing.
    let (clean, _) = record(dir.path(), &bin, "10000", &[]);
    let c = clean.to_str().unwrap();
    for (args, code) in [
        (vec!["diff", "-q", t, c], 0),
        (vec!["diff", "-q", c, t, "--fail-on-loss"], 3),
        (vec!["diff", "-q", c, c, "--fail-on-loss"], 0),
    ] {
        let out = run(&args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            stderr_of(&out)
        );
        let err = stderr_of(&out);
        let warnings = lines_with(&err, "memleak: warning:");
        let text = String::from_utf8(out.stdout).unwrap();
        if args[2] == c && args[3] == c {
            assert_eq!(warnings, Vec::<&str>::new(), "{args:?}");
            assert!(!text.contains("WARNING"), "{text}");
            continue;
        }
        let side = if args[2] == t { "base" } else { "new" };
        assert_eq!(
            warnings,
            [format!("memleak: warning: {side} trace: {warning}")],
            "{args:?}"
        );
        assert_eq!(
            text.lines().next(),
            Some(&*format!(
                "WARNING: in the {} recording, {warning}.",
                side.to_uppercase()
            ))
        );
        let out = run(&[&args[..4], &["--format", "json"]].concat());
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["summary"]["uncertain"], true);
        assert_eq!(j["summary"][side]["uncertain"], true);
        assert_eq!(j["summary"][side]["lost_events"]["missing"], lost);
    }
}

#[test]
fn a_recording_without_loss_warns_of_nothing() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = alloc_pairs(dir.path());
    let (trace, rec_err) = record(dir.path(), &bin, "10000", &[]);
    let meta = memleak_trace::Meta::load(&trace).unwrap();
    assert_eq!(
        meta.counters.losses().missing_total(),
        0,
        "{:?}",
        meta.counters.lost
    );
    assert!(!rec_err.contains("uncertain"), "{rec_err}");
    assert!(!rec_err.contains("--ring-size"), "{rec_err}");

    let t = trace.to_str().unwrap();
    let (json, out) = analyze_json(t);
    let s = &json["summary"];
    assert_eq!(s["uncertain"], false);
    assert_eq!(s["lost_events"]["missing"], 0);
    assert!(s["lost_events"].get("warning").is_none(), "{s}");
    // Nothing lost, the truth: 2,000 leaks of 64 bytes.
    assert_eq!(
        (
            s["outstanding_bytes"].as_u64(),
            s["outstanding_allocations"].as_u64()
        ),
        (Some(128_000), Some(2_000))
    );
    assert_eq!(
        lines_with(&stderr_of(&out), "memleak: warning:"),
        Vec::<&str>::new()
    );

    let out = run(&["analyze", "-q", t, "--fail-on-loss"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(!stderr_of(&out).contains("warning"), "{}", stderr_of(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("WARNING"), "{text}");

    let html = dir.path().join("report.html");
    analyze_to(t, "html", &html);
    assert!(!std::fs::read_to_string(&html)
        .unwrap()
        .contains("lost-events"));
}
