//! The leak scan of a recording, end to end with real probes: a program
//! with known pointer shapes (`crates/recorder/tests/scan_shapes.c`) is
//! recorded to its exit, and the `scan` table must hold the right verdict
//! for each of its blocks, with the scan's figures in `meta.json`.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixtures::{memleak, recording_guard};
use memleak_trace::{ScanVerdict, Trace};

fn build_shapes(dir: &Path) -> PathBuf {
    let src = common::fixtures::root().join("crates/recorder/tests/scan_shapes.c");
    let exe = dir.join("scan_shapes");
    let status = Command::new("cc")
        .args(["-O0", "-g", "-pthread", "-o"])
        .arg(&exe)
        .arg(src)
        .status()
        .expect("cc runs");
    assert!(status.success(), "building scan_shapes failed");
    exe
}

/// (name, address, size) of each block the program reported.
fn reported(stdout: &[u8]) -> Vec<(String, u64, u64)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .take_while(|l| *l != "ready")
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].to_string(),
                u64::from_str_radix(f[1], 16).unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_command_is_scanned_at_exit_with_a_verdict_per_block() {
    scanned_at_exit(false);
}

/// The same, with the recorder's replay of the outstanding blocks sent
/// no batch (as when it falls behind under load): the scan has it catch
/// up from the trace's files, and the verdicts are the same.
#[test]
fn a_scan_whose_replay_fell_behind_catches_up_from_the_files() {
    scanned_at_exit(true);
}

fn scanned_at_exit(behind: bool) {
    if !common::can_record() || !common::has_tool("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_shapes(dir.path());
    let trace = dir.path().join("t.parquet");
    let out = {
        let _guard = recording_guard(false);
        let mut cmd = memleak();
        if behind {
            cmd.env("MEMLEAK_TEST_FOLLOW_BEHIND", "1");
        }
        cmd.args(["record", "--scan-contents", "8", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&exe)
            .arg("exit")
            .output()
            .unwrap()
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("memleak: scan of pid"))
        .unwrap_or_else(|| panic!("no scan summary in:\n{stderr}"));
    assert!(line.contains("paused") && line.contains("ms/MiB"), "{line}");
    let blocks = reported(&out.stdout);
    assert_eq!(blocks.len(), 19, "{blocks:?}");

    let t = Trace::open(&trace).unwrap();
    let scans = &t.meta().scans;
    assert_eq!(scans.len(), 1, "{scans:?}");
    let info = &scans[0];
    assert_eq!(info.error, None);
    assert_eq!(info.pid, t.meta().pids[0]);
    assert_eq!(info.threads, 3);
    assert!(info.roots_bytes > 0 && info.heap_bytes > 0 && info.pause_ns > 0);
    let rows = t.scans().unwrap();
    assert_eq!(rows.len() as u64, info.blocks);
    assert!(rows
        .iter()
        .all(|r| r.ts_ns == info.ts_ns && r.pid == info.pid));
    let by_addr: HashMap<u64, &memleak_trace::ScanRecord> =
        rows.iter().map(|r| (r.addr, r)).collect();
    let mut verdicts: HashMap<&str, Vec<ScanVerdict>> = HashMap::new();
    for (name, addr, size) in &blocks {
        let row = by_addr
            .get(addr)
            .unwrap_or_else(|| panic!("no scan row for {name} at {addr:#x}"));
        assert_eq!(row.size, *size, "{name}");
        verdicts.entry(name).or_default().push(row.verdict);
        // --scan-contents 8: the first bytes of lost blocks only.
        let lost = row.verdict != ScanVerdict::Reachable;
        assert_eq!(
            row.contents.as_ref().map(Vec::len),
            lost.then_some(8.min(*size as usize)),
            "{name}"
        );
    }
    use ScanVerdict::*;
    let expect: &[(&str, &[ScanVerdict])] = &[
        ("reach_a", &[Reachable]),
        ("reach_b", &[Reachable]),
        ("stack", &[Reachable]),
        ("register", &[Reachable]),
        ("possible_c", &[PossiblyLost]),
        ("possible_d", &[PossiblyLost]),
        ("tree_root", &[DefinitelyLost]),
        ("tree_inner", &[IndirectlyLost; 6]),
        ("newarray", &[Reachable]),
        ("lost", &[DefinitelyLost]),
        ("mapping", &[Reachable]),
        ("behind_unreadable", &[Reachable]),
    ];
    for (name, want) in expect {
        assert_eq!(verdicts[name].as_slice(), *want, "{name}");
    }
    let mut cycle = verdicts["cycle"].clone();
    cycle.sort();
    assert_eq!(cycle, [DefinitelyLost, IndirectlyLost]);
}

#[test]
fn no_scan_records_no_scan() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let out = {
        let _guard = recording_guard(false);
        memleak()
            .args(["record", "-q", "--no-scan", "-o"])
            .arg(&trace)
            .args(["--", "true"])
            .output()
            .unwrap()
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = Trace::open(&trace).unwrap();
    assert!(t.meta().scans.is_empty());
    assert!(t.scans().unwrap().is_empty());
}

#[test]
fn scan_options_without_a_scan_are_refused() {
    let out = memleak()
        .args(["record", "--no-scan", "--scan-contents", "16", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // Checked before the root check: the same line for everyone.
    assert!(
        err.starts_with("memleak: error: --scan-contents needs a scan"),
        "{err}"
    );
    let out = memleak()
        .args(["record", "--scan-contents", "5000", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `-p PID --scan`: every thread is stopped for the scan and let go;
/// the scan's figures are in `meta.json` (the blocks the program made
/// before the recording are not in the trace, so there are no rows).
#[test]
fn a_running_process_is_scanned_at_the_end_and_left_running() {
    if !common::can_record() || !common::has_tool("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_shapes(dir.path());
    let mut target = Command::new(&exe)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until its threads run: it prints "ready" then.
    let mut stdout = std::io::BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() > 0);
    }
    let pid = target.id();
    let trace = dir.path().join("t.parquet");
    let out = {
        let _guard = recording_guard(false);
        memleak()
            .args([
                "record",
                "-q",
                "--scan",
                "-d",
                "500ms",
                "-p",
                &pid.to_string(),
                "-o",
            ])
            .arg(&trace)
            .output()
            .unwrap()
    };
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap()
        .rsplit_once(')')
        .and_then(|(_, r)| r.trim_start().chars().next())
        .unwrap();
    let _ = target.kill();
    let _ = target.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(state, 't', "left stopped by ptrace");
    assert_ne!(state, 'T', "left stopped");
    let t = Trace::open(&trace).unwrap();
    let scans = &t.meta().scans;
    assert_eq!(scans.len(), 1, "{scans:?}");
    assert_eq!(scans[0].pid, pid);
    assert_eq!(scans[0].error, None);
    assert_eq!(scans[0].threads, 3);
    assert!(scans[0].roots_bytes > 0 && scans[0].pause_ns > 0);
    assert_eq!(t.scans().unwrap().len() as u64, scans[0].blocks);
}
