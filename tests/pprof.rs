//! End to end: the pprof export of real recordings of fixtures, read by
//! two decoders that are not memleak's: Google's protobuf package for
//! Python (tests/python/read_pprof.py) and `go tool pprof`. Their sample
//! values, totals, frames (inlined functions included), mappings with
//! build ids and times must be the JSON report's, filters included.
//!
//! Needs root (recording), python3 with `google.protobuf` and protoc; the
//! `go tool pprof` checks skip with a line when `go` is missing.
#![cfg(feature = "bpf")]

mod common;

use std::path::Path;
use std::process::Command;

use common::fixtures::{memleak, root, Fixture};
use serde_json::Value;

/// Runs `memleak analyze TRACE ARGS...` and returns its stdout.
fn analyze(trace: &Path, args: &[&str]) -> Vec<u8> {
    let out = memleak()
        .args(["analyze", "-q"])
        .arg(trace)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "analyze {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The JSON report (every leaking stack) and the decoded profile of a
/// trace under the same filters.
fn reports(trace: &Path, filters: &[&str]) -> (Value, Value) {
    let json: Value = serde_json::from_slice(&analyze(
        trace,
        &[&["--format", "json", "-T", "0"], filters].concat(),
    ))
    .unwrap();
    let profile = trace.with_extension(format!("{}.pb.gz", filters.len()));
    analyze(
        trace,
        &[
            &["--format", "pprof", "-o", profile.to_str().unwrap()],
            filters,
        ]
        .concat(),
    );
    (json, decode(&profile))
}

fn decode(profile: &Path) -> Value {
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
    assert_eq!(p["problems"], serde_json::json!([]), "malformed profile");
    p
}

/// The sum of each sample value: inuse objects and bytes, alloc objects
/// and bytes.
fn totals(p: &Value) -> [u64; 4] {
    let mut t = [0u64; 4];
    for s in p["samples"].as_array().unwrap() {
        for (i, v) in s["values"].as_array().unwrap().iter().enumerate() {
            t[i] += v.as_u64().unwrap();
        }
    }
    t
}

/// The report's totals of the four sample values: outstanding
/// allocations and bytes from the JSON summary; allocations and bytes
/// allocated by every stack (not only the leaking ones JSON lists) from
/// the folded output, since, unlike the summary's, these per-stack totals
/// honour the size and time filters.
fn report_totals(trace: &Path, json: &Value, filters: &[&str]) -> [u64; 4] {
    let s = &json["summary"];
    let folded = |weight: &str| -> u64 {
        let out = analyze(
            trace,
            &[&["--format", "folded", "--weight", weight], filters].concat(),
        );
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    [
        s["outstanding_allocations"].as_u64().unwrap(),
        s["outstanding_bytes"].as_u64().unwrap(),
        folded("allocations"),
        folded("allocated-bytes"),
    ]
}

/// The profile's lines of a JSON frame, innermost first: the inlined
/// functions, then the function containing the address.
fn frame_lines(f: &Value) -> Vec<(String, String, i64)> {
    let line = |v: &Value| {
        (
            v["function"].as_str().unwrap().to_string(),
            v["file"].as_str().unwrap_or("").to_string(),
            v["line"].as_i64().unwrap_or(0),
        )
    };
    if f["function"].is_null() {
        return Vec::new();
    }
    let mut out: Vec<_> = f["inlined"].as_array().unwrap().iter().map(line).collect();
    out.push(line(f));
    out
}

/// Every leaking stack of the JSON report is one sample of the profile
/// with the same values, labels and frames; every frame's location lies
/// in a mapping of its object at its file offset.
fn check_stacks(json: &Value, p: &Value) {
    let samples = p["samples"].as_array().unwrap();
    let mappings = p["mappings"].as_array().unwrap();
    for s in json["stacks"].as_array().unwrap() {
        let id = s["stack_id"].as_u64().unwrap();
        let sample = samples
            .iter()
            .find(|x| x["labels"]["stack_id"].as_u64() == Some(id))
            .unwrap_or_else(|| panic!("no sample for stack {id}"));
        let want: Vec<u64> = ["count", "bytes", "allocations", "allocated_bytes"]
            .iter()
            .map(|k| s[k].as_u64().unwrap())
            .collect();
        assert_eq!(sample["values"], serde_json::json!(want), "stack {id}");
        assert_eq!(sample["labels"]["pid"], s["pid"], "stack {id}");
        let frames = s["frames"].as_array().unwrap();
        let locations = sample["locations"].as_array().unwrap();
        assert_eq!(locations.len(), frames.len(), "stack {id}: frames");
        for (f, loc) in frames.iter().zip(locations) {
            let addr =
                u64::from_str_radix(f["addr"].as_str().unwrap().trim_start_matches("0x"), 16)
                    .unwrap();
            assert_eq!(loc["address"].as_u64(), Some(addr), "stack {id}");
            let lines: Vec<_> = loc["lines"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    assert_eq!(l["name"], l["system_name"]);
                    (
                        l["name"].as_str().unwrap().to_string(),
                        l["file"].as_str().unwrap().to_string(),
                        l["line"].as_i64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(lines, frame_lines(f), "stack {id}: lines at {addr:#x}");
            if let (Some(path), Some(off)) = (f["path"].as_str(), f["file_offset"].as_u64()) {
                let m = &mappings[loc["mapping"].as_u64().unwrap() as usize - 1];
                assert_eq!(
                    m["file"].as_str(),
                    Some(path),
                    "stack {id}: mapping of {addr:#x}"
                );
                let start = m["start"].as_u64().unwrap();
                assert_eq!(
                    addr - start + m["offset"].as_u64().unwrap(),
                    off,
                    "stack {id}: file offset of {addr:#x}"
                );
            }
        }
    }
}

/// The GNU build id of an ELF file, as `readelf -n` prints it.
fn build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no build id", path.display()))
        .to_string()
}

/// `go tool pprof -top`'s total of one sample type, in bytes or counts.
fn go_total(profile: &Path, index: &str) -> u64 {
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-unit=B"])
        .arg(format!("-sample_index={index}"))
        .arg(profile)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "Showing nodes accounting for 432B, 100% of 432B total"
    let total = text
        .lines()
        .find_map(|l| l.split(" of ").nth(1)?.strip_suffix(" total"))
        .unwrap_or_else(|| panic!("no total in go tool pprof -top:\n{text}"));
    total
        .trim_end_matches('B')
        .parse()
        .unwrap_or_else(|_| panic!("total {total:?}"))
}

fn has_go() -> bool {
    let runs = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !runs {
        common::skip("the go tool pprof checks: go is not installed");
    }
    runs
}

/// What every export is checked for: the Python decode agrees with the
/// JSON report stack by stack and in total, and so does `go tool pprof`.
fn check_profile(trace: &Path, filters: &[&str]) -> (Value, Value) {
    let (json, p) = reports(trace, filters);
    let t = report_totals(trace, &json, filters);
    assert_eq!(totals(&p), t, "totals, filters {filters:?}");
    if filters.is_empty() {
        let s = &json["summary"];
        assert_eq!(t[2], s["allocations"].as_u64().unwrap());
        assert_eq!(t[3], s["allocated_bytes"].as_u64().unwrap());
    }
    check_stacks(&json, &p);
    assert_eq!(
        p["sample_types"],
        serde_json::json!([
            ["inuse_objects", "count"],
            ["inuse_space", "bytes"],
            ["alloc_objects", "count"],
            ["alloc_space", "bytes"]
        ])
    );
    assert_eq!(p["default_sample_type"], "inuse_space");
    assert_eq!(p["duration_nanos"], json["summary"]["duration_ns"]);
    if has_go() {
        let profile = trace.with_extension(format!("{}.pb.gz", filters.len()));
        for (i, index) in [
            "inuse_objects",
            "inuse_space",
            "alloc_objects",
            "alloc_space",
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(
                go_total(&profile, index),
                t[i],
                "go tool pprof {index}, {filters:?}"
            );
        }
    }
    (json, p)
}

#[test]
fn inline_fixture_profile() {
    if !common::can_record() || !common::has_tool("protoc") {
        return;
    }
    let fx = Fixture::load("inline");
    let (_dir, trace) = fx.record(&[]);
    let (json, p) = check_profile(&trace, &[]);
    // The fixture's known leak: 4 blocks of 108 bytes, of 6 made.
    assert_eq!(totals(&p), [4, 432, 6, 648]);

    // One return address covers inner and middle, inlined into outer:
    // one location, three lines, innermost first.
    let sample = &p["samples"].as_array().unwrap()[0];
    let top = &sample["locations"][0]["lines"];
    let names: Vec<_> = top
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["name"].as_str().unwrap(), l["line"].as_i64().unwrap()))
        .collect();
    assert_eq!(names, [("inner", 8), ("middle", 15), ("outer", 21)]);
    assert!(top[0]["file"].as_str().unwrap().ends_with("inline.c"));

    // The program's mapping: its path and its build id, first (pprof takes
    // the first mapping for the main program).
    let m = &p["mappings"][0];
    let binary = fx.binary();
    assert_eq!(m["file"].as_str(), Some(binary.to_str().unwrap()));
    assert_eq!(m["build_id"].as_str(), Some(build_id(&binary).as_str()));
    assert_eq!(m["has_inline_frames"], true);
    assert_eq!(sample["locations"][0]["mapping"], 1);

    // Recording start on the wall clock, from meta.json's clock pair.
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(trace.join("meta.json")).unwrap()).unwrap();
    let wall = meta["clock"]["realtime_ns"].as_u64().unwrap() + meta["start_ns"].as_u64().unwrap()
        - meta["clock"]["monotonic_ns"].as_u64().unwrap();
    assert_eq!(p["time_nanos"].as_u64(), Some(wall));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(
        wall < now && now - wall < 3_600_000_000_000,
        "time_nanos {wall}, now {now}"
    );
    assert!(json["summary"]["duration_ns"].as_u64().unwrap() > 0);

    // go tool pprof shows the frames by name and source line, inlined ones
    // marked.
    if has_go() {
        let profile = trace.with_extension("0.pb.gz");
        let out = Command::new("go")
            .args(["tool", "pprof", "-traces", "-lines"])
            .arg(&profile)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        for want in [
            "inner ",
            "inline.c:8 (inline)",
            "middle ",
            "inline.c:15 (inline)",
        ] {
            assert!(
                text.contains(want),
                "no {want:?} in go tool pprof -traces:\n{text}"
            );
        }
        let outer = text.lines().find(|l| l.contains("outer ")).unwrap_or("");
        assert!(outer.trim_end().ends_with("inline.c:21"), "{text}");
    }
}

#[test]
fn realloc_fixture_profile_with_filters() {
    if !common::can_record() || !common::has_tool("protoc") {
        return;
    }
    let fx = Fixture::load("realloc");
    let (_dir, trace) = fx.record(&[]);
    let (json, p) = check_profile(&trace, &[]);
    let expected: u64 = fx.expected["outstanding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(totals(&p)[1], expected);
    // Stacks that freed everything still have their allocations.
    let stacks = json["summary"]["outstanding_stacks"].as_u64().unwrap() as usize;
    assert!(p["samples"].as_array().unwrap().len() > stacks);

    // Filters select the same allocations as in the JSON report.
    let pid = json["stacks"][0]["pid"].as_u64().unwrap().to_string();
    let filters = [
        "--max-size",
        "500",
        "--kind",
        "heap",
        "--pid",
        &pid,
        "--from",
        "0",
    ];
    let (fjson, fp) = check_profile(&trace, &filters);
    assert!(
        totals(&fp)[1] < totals(&p)[1],
        "the size filter selected nothing less"
    );
    assert!(fjson["summary"]["outstanding_bytes"].as_u64().unwrap() > 0);
    assert!(p["comments"].as_array().unwrap().len() < fp["comments"].as_array().unwrap().len());

    // The state halfway through the recording: the profile covers that
    // span (checked against the JSON report's duration).
    let half = json["summary"]["duration_ns"].as_u64().unwrap() / 2;
    let at = format!("{half}ns");
    let (ajson, ap) = check_profile(&trace, &["--at", &at, "--older-than", "1us"]);
    assert_eq!(ap["duration_nanos"].as_u64(), Some(half));
    assert_eq!(ajson["summary"]["at_given"], true);
}

#[test]
fn format_all_writes_the_profile() {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("seed");
    let (dir, trace) = fx.record(&[]);
    let out = dir.path().join("all");
    analyze(&trace, &["--format", "all", "-o", out.to_str().unwrap()]);
    let gz = std::fs::read(out.join("profile.pb.gz")).unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "not gzip");
    // To a pipe, the same bytes.
    assert_eq!(analyze(&trace, &["--format", "pprof"]), gz);
}
