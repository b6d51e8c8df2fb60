//! `memleak analyze ROOT` end to end, on three real recordings of
//! `fixtures/diff_leak.c` laid out as a dataset (`ROOT/host=H/trace=1/`):
//! two of one build, one of a build whose code sits elsewhere. Every
//! stack of the merged report holds the sum of what each trace's own
//! analysis finds under its symbolized frames, and the breakdown by host
//! gives each trace's figures.
//!
//! Needs root and a kernel with uprobe sessions, as CI has.
#![cfg(feature = "bpf")]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::fixtures::{build_diff_leak, memleak, record_command};
use memleak_analyze::diff::{stack_key, MatchOptions};
use serde_json::Value;

/// diff_leak.c built with `defines`.
fn build(defines: &[&str]) -> (tempfile::TempDir, PathBuf) {
    build_diff_leak(defines, "")
}

/// Outstanding (bytes, count) by stack key, from the library's analysis
/// of one trace.
fn by_key(trace: &Path) -> BTreeMap<String, (u64, u64)> {
    let r = memleak_analyze::analyze(trace, &Default::default()).unwrap();
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in r.stacks.iter().filter(|s| s.count > 0) {
        let e = out
            .entry(stack_key(s, MatchOptions::default()))
            .or_default();
        e.0 += s.bytes;
        e.1 += s.count;
    }
    out
}

#[test]
fn analyze_root_merges_real_recordings() {
    if !common::can_record() {
        return;
    }
    let (_a, plain) = build(&[]);
    let (_b, padded) = build(&["-DPAD"]);
    let dataset = tempfile::tempdir().unwrap();
    let mut traces = Vec::new();
    let mut keep = Vec::new();
    for (host, bin) in [("alpha", &plain), ("beta", &plain), ("gamma", &padded)] {
        let (dir, trace) = record_command(&[bin.as_os_str()], &[]);
        let to = dataset.path().join(format!("host={host}/trace=1"));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::rename(&trace, &to).unwrap();
        traces.push((host, to));
        keep.push(dir);
    }
    let out = memleak()
        .arg("analyze")
        .arg(dataset.path())
        .args(["-q", "-T", "0", "--format", "json", "--group-by", "host"])
        // The library's defaults, which the single analyses below use.
        .arg("--no-default-suppressions")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();

    let mut want: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (host, trace) in &traces {
        let own = by_key(trace);
        let (bytes, count) = own.values().fold((0, 0), |(b, c), (x, y)| (b + x, c + y));
        let row = report["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["group"] == *host)
            .unwrap_or_else(|| panic!("no row of {host}"));
        assert_eq!(
            (row["bytes"].as_u64(), row["count"].as_u64()),
            (Some(bytes), Some(count))
        );
        assert_eq!(row["traces"], 1);
        for (k, (b, c)) in own {
            let e = want.entry(k).or_default();
            e.0 += b;
            e.1 += c;
        }
    }
    let got: BTreeMap<String, (u64, u64)> = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["count"].as_u64() > Some(0))
        .map(|s| {
            let k = s["key"].as_str().unwrap().to_string();
            (
                k,
                (s["bytes"].as_u64().unwrap(), s["count"].as_u64().unwrap()),
            )
        })
        .collect();
    assert_eq!(got, want);
    // The program's leak, found in all three, of both builds.
    let leak = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["frames"][0]["function"] == "leak_path")
        .expect("leak_path leaks");
    assert_eq!(leak["traces"], 3, "{leak:#}");
    assert_eq!(
        (leak["bytes"].as_u64(), leak["count"].as_u64()),
        (Some(3 * 336), Some(21))
    );
    assert_eq!(report["traces"].as_array().unwrap().len(), 3);
    assert_eq!(report["traces"][0]["host"], "alpha");

    // Text: the breakdown by host.
    let out = memleak()
        .arg("analyze")
        .args(traces.iter().map(|(_, t)| t))
        .args(["-q", "--group-by", "host"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("Outstanding by host (3 hosts, 3 traces)"),
        "{text}"
    );
    // --pid names a process of one recording.
    let out = memleak()
        .arg("analyze")
        .arg(dataset.path())
        .args(["-q", "--pid", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not with several traces"));
}
