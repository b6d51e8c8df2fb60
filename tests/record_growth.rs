//! End to end: growth verdicts and the peak view on fixtures recorded with
//! the real probes. Each growth fixture has one stack whose verdict is
//! known (`growth` in its expected file), checked where a user sees it:
//! the JSON of `memleak analyze --sort growth`. The peak fixture's
//! `--at peak` view is checked exactly, overall and per process.
//!
//! Needs root and a kernel with uprobe sessions, as CI has.
#![cfg(feature = "bpf")]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::fixtures::{check_trace, memleak, Fixture};
use serde_json::Value;

/// `memleak analyze TRACE --format json -T 0 ARGS…`, parsed.
fn analyze_json(trace: &Path, args: &[&str]) -> Value {
    let out = memleak()
        .arg("analyze")
        .arg(trace)
        .args(["--format", "json", "-T", "0"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "analyze {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The stacks of a JSON report by their innermost function.
fn by_function(doc: &Value) -> BTreeMap<String, Value> {
    doc["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| {
            let f = s["frames"][0]["function"].as_str()?.to_string();
            Some((f, s.clone()))
        })
        .collect()
}

fn check_growth(name: &str) {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load(name);
    let (_dir, trace) = fx.record(&[]);
    check_trace(&fx, &trace, &["outstanding"]);
    let doc = analyze_json(&trace, &["--sort", "growth"]);
    assert_eq!(doc["summary"]["sort"], "growth");
    let timeline = &doc["timeline"];
    let windows = timeline["total_bytes"].as_array().unwrap().len();
    assert_eq!(windows, 64, "{name}: timeline windows");
    let stacks = by_function(&doc);
    for (function, verdict) in fx.expected["growth"].as_object().unwrap() {
        let s = stacks
            .get(function)
            .unwrap_or_else(|| panic!("{name}: no stack from {function} in {stacks:?}"));
        let g = &s["growth"];
        assert_eq!(g["verdict"], *verdict, "{name}: {function}: {g}");
        let samples: Vec<u64> = g["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(samples.len(), windows);
        // The last sample is the state the report shows.
        assert_eq!(samples.last().copied(), s["bytes"].as_u64(), "{name}: {g}");
        let fit = g["fit"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&fit), "{name}: fit {fit}");
        let slope = g["slope_bytes_per_s"].as_f64().unwrap();
        match verdict.as_str().unwrap() {
            "growing" => assert!(slope > 0.0, "{name}: slope {slope}"),
            "transient" => {
                // Listed although nothing is outstanding: it held every
                // block at once before freeing them.
                assert_eq!(s["count"], 0);
                let allocations = s["allocations"].as_u64().unwrap();
                assert_eq!(allocations, 40, "{name}");
                assert_eq!(
                    samples.iter().max().copied(),
                    Some(40 * 1500),
                    "{name}: {g}"
                );
            }
            _ => {}
        }
    }
    // Sorted by size, a transient stack (nothing outstanding) is not
    // listed.
    let by_bytes = by_function(&analyze_json(&trace, &[]));
    for (function, verdict) in fx.expected["growth"].as_object().unwrap() {
        assert_eq!(
            by_bytes.contains_key(function),
            verdict != "transient",
            "{name}: {function} listed by bytes"
        );
    }
}

#[test]
fn grow_leak() {
    check_growth("grow_leak");
}

#[test]
fn grow_cache() {
    check_growth("grow_cache");
}

#[test]
fn grow_transient() {
    check_growth("grow_transient");
}

/// `--at peak` reports exactly the blocks held at the peak: of the live
/// total, of the parent alone, of the child alone.
#[test]
fn peak_view() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("peak");
    let (_dir, trace) = fx.record(&["--follow-forks"]);
    check_trace(&fx, &trace, &["outstanding", "child_outstanding"]);
    let pids = memleak_trace::Trace::open(&trace)
        .unwrap()
        .meta()
        .pids
        .clone();
    assert_eq!(pids.len(), 2, "parent and child recorded: {pids:?}");
    let views = [
        ("overall", None, 140_000),
        ("parent", Some(pids[0]), 50_000),
        ("child", Some(pids[1]), 120_000),
    ];
    for (view, pid, peak) in views {
        let pid_arg = pid.map(|p| p.to_string());
        let mut args = vec!["--at", "peak"];
        if let Some(p) = &pid_arg {
            args.extend(["--pid", p]);
        }
        let doc = analyze_json(&trace, &args);
        let at = &doc["summary"]["at_peak"];
        assert_eq!(at["pid"].as_u64(), pid.map(u64::from), "{view}: {at}");
        // The parent's runtime (ld.so, libc) holds a little besides.
        let bytes = at["bytes"].as_u64().unwrap();
        assert!(bytes >= peak && bytes < peak + 4096, "{view}: {at}");
        let stacks = by_function(&doc);
        for (function, want) in fx.expected["peaks"][view].as_object().unwrap() {
            let got = stacks.get(function).map_or((0, 0), |s| {
                (s["bytes"].as_u64().unwrap(), s["count"].as_u64().unwrap())
            });
            let want = (want[0].as_u64().unwrap(), want[1].as_u64().unwrap());
            assert_eq!(got, want, "{view} peak view: {function}");
        }
    }
}
