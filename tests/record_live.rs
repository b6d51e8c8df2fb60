//! `record`'s live output: the reports of `--interval` (bcc's `-p PID
//! INTERVAL [COUNT]`), checked against a program that leaks on a known
//! schedule; the trace they leave unchanged; the status line and the end
//! summary.
#![cfg(feature = "bpf")]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::fixtures::{fixtures_dir, memleak, recording_guard, Fixture};
use common::procs::wait_within;
use memleak_trace::reader::EventColumns;
use memleak_trace::{EventKind, Trace};

/// `leak_rate`'s schedule: block k is leaked 10 ms × k after the first.
const PERIOD_NS: u64 = 10_000_000;
const BLOCKS: u64 = 350;

/// One live report: its time since the recording's start, and the
/// outstanding blocks and bytes it printed in total and for leak_one.
#[derive(Debug)]
struct Report {
    elapsed_ns: u64,
    total_blocks: u64,
    total_bytes: f64,
    leak_blocks: u64,
    leak_bytes: f64,
}

/// `96.7 KiB` → bytes.
fn size(text: &str) -> f64 {
    let (n, unit) = text.trim().split_once(' ').unwrap();
    let n: f64 = n.trim_start_matches('+').parse().unwrap();
    n * match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        u => panic!("unit {u}"),
    }
}

fn reports(stdout: &str) -> Vec<Report> {
    let mut out: Vec<Report> = Vec::new();
    for line in stdout.lines() {
        // [HH:MM:SS] +1.35s: 96.7 KiB outstanding in 99 blocks (...
        if let Some((_, rest)) = line.split_once("] +") {
            let (secs, rest) = rest.split_once("s: ").unwrap();
            let (bytes, rest) = rest.split_once(" outstanding in ").unwrap();
            let blocks = rest.split_once(' ').unwrap().0;
            out.push(Report {
                elapsed_ns: (secs.parse::<f64>().unwrap() * 1e9) as u64,
                total_blocks: blocks.parse().unwrap(),
                total_bytes: size(bytes),
                leak_blocks: 0,
                leak_bytes: 0.0,
            });
        } else if line.contains("leak_one (leak_rate.c:18) < main (leak_rate.c:44)") {
            // bytes, blocks, change, blocks±, stack
            let cols: Vec<&str> = line.split("  ").filter(|c| !c.trim().is_empty()).collect();
            let r = out.last_mut().expect("a stack row before any report");
            r.leak_bytes = size(cols[0]);
            r.leak_blocks = cols[1].trim().parse().unwrap();
        }
    }
    out
}

/// When leak_rate leaked its first block (its schedule's origin), on the
/// events' clock.
fn first_leak_ns(trace: &Path) -> u64 {
    let t = Trace::open(trace).unwrap();
    let cols = EventColumns::TS | EventColumns::KIND | EventColumns::SIZE;
    for b in t.events(cols).unwrap() {
        let b = b.unwrap();
        for i in 0..b.len() {
            if b.kind[i] == EventKind::Malloc && b.size[i] == 1000 {
                return b.ts_ns[i];
            }
        }
    }
    panic!("no leak in the trace");
}

/// The acceptance test of the live reports: every figure printed is
/// within one interval (100 blocks, 100,000 bytes at leak_rate's 100
/// blocks/s) of what the program had leaked at that moment, which its
/// clock-kept schedule gives: at time T, 1 + floor((T - first leak) /
/// 10 ms) blocks. T is the report's time (the recording's start in meta.json
/// plus the elapsed time it prints: the events' clock). A report lagging
/// a whole interval behind, or counting a free as a leak, fails.
fn live_reports_follow_the_leak(capture: &str) {
    if !common::can_record() {
        return;
    }
    let fx = Fixture::load("leak_rate");
    let _guard = recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let out = memleak()
        .args([
            "record",
            "--capture",
            capture,
            "--interval",
            "1s",
            "-T",
            "3",
            "-o",
        ])
        .arg(&trace)
        .arg("--")
        .arg(fx.binary())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let meta = Trace::open(&trace).unwrap().meta().clone();
    assert_eq!(meta.capture.as_deref(), Some(capture));
    let origin = first_leak_ns(&trace);
    let reports = reports(&stdout);
    // 3.5 s of leaking: reports at 1, 2 and 3 s at least.
    assert!(reports.len() >= 3, "{stdout}");
    let interval_blocks = 1_000_000_000 / PERIOD_NS;
    for r in &reports {
        let at = meta.start_ns + r.elapsed_ns;
        let truth = if at < origin {
            0
        } else {
            ((at - origin) / PERIOD_NS + 1).min(BLOCKS)
        };
        let near = |blocks: u64| blocks.abs_diff(truth) <= interval_blocks;
        let near_bytes = |bytes: f64| (bytes - truth as f64 * 1000.0).abs() <= 100_000.0 + 1000.0;
        assert!(near(r.leak_blocks), "{r:?}, truth {truth}:\n{stdout}");
        assert!(near_bytes(r.leak_bytes), "{r:?}, truth {truth}:\n{stdout}");
        // The churned buffer is freed at once: the total is the leak, and
        // at most a few runtime blocks.
        assert!(
            r.total_blocks >= r.leak_blocks && near(r.total_blocks),
            "{r:?}"
        );
        assert!(near_bytes(r.total_bytes), "{r:?}");
    }
    // The trace itself is the whole truth: 350 leaks.
    let report = common::fixtures::check_trace(&fx, &trace, &["outstanding"]);
    assert_eq!(report.summary.outstanding_allocations, 350);
}

#[test]
fn live_reports_follow_the_leak_with_the_probes() {
    live_reports_follow_the_leak("bpf");
}

#[test]
fn live_reports_follow_the_leak_with_the_agent() {
    live_reports_follow_the_leak("preload");
}

/// bcc's `memleak -p PID INTERVAL COUNT`: COUNT reports, then the
/// recording ends by itself while the process runs on.
#[test]
fn positional_interval_and_count_stop_after_count_reports() {
    if !common::can_record() {
        return;
    }
    let _guard = recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let mut target = Command::new(fixtures_dir().join("leak_rate"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = target.id().to_string();
    let trace = dir.path().join("t.parquet");
    let rec = memleak()
        .args(["record", "-p", &pid, "0.5", "2", "-o"])
        .arg(&trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = rec.wait_with_output().unwrap();
    let target_status = wait_within(&mut target, 30, "leak_rate");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(target_status.success());
    let reports = reports(&stdout);
    assert_eq!(reports.len(), 2, "{stdout}");
    assert!(reports[1].leak_blocks > 0, "{stdout}");
    assert!(Trace::open(&trace).unwrap().meta().complete);
}

/// Events and stacks of a trace, without what differs between two runs
/// of the same program: times (the clock) and the process id (the pid
/// and, for a single thread, the tid), which are checked to be the
/// program's own. Everything else (order, kind, address, size, old
/// address and size, stack id, each stack's frames) is the program's and
/// the recorder's doing.
type Rows = (
    Vec<(EventKind, u64, u64, u64, u64, u64)>,
    Vec<(u64, bool, Vec<u64>)>,
);

fn content(trace: &Path) -> Rows {
    let t = Trace::open(trace).unwrap();
    let pid = t.meta().pids[0];
    let mut events = Vec::new();
    for b in t.events(EventColumns::ALL).unwrap() {
        let b = b.unwrap();
        for i in 0..b.len() {
            assert_eq!((b.pid[i], b.tid[i]), (pid, pid));
            events.push((
                b.kind[i],
                b.addr[i],
                b.size[i],
                b.old_addr[i],
                b.old_size[i],
                b.stack_id[i],
            ));
        }
    }
    let mut stacks: Vec<_> = t
        .stacks()
        .unwrap()
        .into_iter()
        .map(|s| (s.stack_id, s.truncated, s.frames))
        .collect();
    stacks.sort();
    (events, stacks)
}

/// Live reports read the recorder's state and write nothing: the same
/// program recorded with and without `--interval` gives the same events
/// and stacks. grow_leak is deterministic (one thread, 60 leaks 10 ms
/// apart, so a 100 ms interval prints during the recording), and runs
/// without address randomization (`setarch -R`, inherited by the
/// command), so even its addresses repeat: a report that changed a row,
/// dropped or added one, would show.
fn live_reports_leave_the_trace_unchanged(capture: &str) {
    if !common::can_record() || !common::has_tool("setarch") {
        return;
    }
    let fx = Fixture::load("grow_leak");
    let _guard = recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let record = |name: &str, extra: &[&str]| {
        let trace = dir.path().join(name);
        let out = Command::new("setarch")
            .args([
                "-R",
                env!("CARGO_BIN_EXE_memleak"),
                "record",
                "--capture",
                capture,
            ])
            .args(extra)
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(fx.binary())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (trace, String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (plain, _) = record("plain", &[]);
    let (live, stdout) = record("live", &["--interval", "100ms"]);
    assert!(reports_of(&stdout) >= 2, "the reports ran: {stdout}");
    let (a, b) = (content(&plain), content(&live));
    assert_eq!(a.1, b.1, "stacks differ");
    assert_eq!(a.0.len(), b.0.len(), "event counts differ");
    for (i, (x, y)) in a.0.iter().zip(&b.0).enumerate() {
        assert_eq!(x, y, "event {i} differs");
    }
}

fn reports_of(stdout: &str) -> usize {
    stdout
        .lines()
        .filter(|l| l.contains(" outstanding in "))
        .count()
}

#[test]
fn live_reports_leave_the_trace_unchanged_with_the_probes() {
    live_reports_leave_the_trace_unchanged("bpf");
}

#[test]
fn live_reports_leave_the_trace_unchanged_with_the_agent() {
    live_reports_leave_the_trace_unchanged("preload");
}

/// What a terminal `width` columns wide shows after `bytes`: printable
/// characters, carriage return, newline, erase to end of line (`ESC [
/// K`; other escapes are dropped), and wrapping as terminals do it, at
/// the character after the last column.
fn screen(bytes: &[u8], width: usize) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines: Vec<Vec<char>> = vec![Vec::new()];
    let (mut col, mut pending) = (0usize, false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => (col, pending) = (0, false),
            '\n' => {
                lines.push(Vec::new());
                (col, pending) = (0, false);
            }
            '\x1b' => {
                let mut seq = String::new();
                for c in chars.by_ref() {
                    seq.push(c);
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
                if seq == "[K" {
                    lines.last_mut().unwrap().truncate(col);
                }
            }
            c if c.is_control() => {}
            c => {
                if pending {
                    lines.push(Vec::new());
                    (col, pending) = (0, false);
                }
                let line = lines.last_mut().unwrap();
                if line.len() <= col {
                    line.resize(col + 1, ' ');
                }
                line[col] = c;
                if col + 1 == width {
                    pending = true;
                } else {
                    col += 1;
                }
            }
        }
    }
    lines
        .into_iter()
        .map(|l| l.into_iter().collect::<String>().trim_end().to_string())
        .collect()
}

/// On a terminal the command writes to too, the status line is a line of
/// its own (elapsed time, "of" the --duration, sizes in binary units),
/// never run into the command's output, even output that does not end
/// its line; the summary is in one set of units and ends with the
/// command to run next.
#[test]
fn status_line_keeps_to_its_own_line_on_a_shared_terminal() {
    if !common::can_record() || !common::has_tool("script") {
        return;
    }
    let _guard = recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let cmd = format!(
        "stty cols 100 rows 40; {} record -d 30s -o {} -- sh -c 'sleep 5.5; printf RESULT; sleep 0.5'",
        env!("CARGO_BIN_EXE_memleak"),
        trace.display()
    );
    // script(1) runs it on a pseudo-terminal: memleak and the command
    // share it, as in an interactive shell.
    let mut child = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut s).unwrap();
        s
    });
    let status = wait_within(&mut child, 60, "script memleak record");
    let raw = reader.join().unwrap();
    let lines = screen(&raw, 100);
    let text = lines.join("\n");
    assert!(status.success(), "{text}");
    // Every 5 s, a whole line: "memleak: 5s of 30s: ..." (start-up can
    // make it 6s on a loaded machine).
    let status_line = lines
        .iter()
        .find(|l| l.starts_with("memleak: ") && l.contains("s of 30s: "))
        .unwrap_or_else(|| panic!("no status line in:\n{text}"));
    assert!(status_line.ends_with(" lost"), "{status_line}");
    assert!(
        [" B outstanding", " KiB outstanding", " MiB outstanding"]
            .iter()
            .any(|u| status_line.contains(u)),
        "{status_line}"
    );
    // The command's output stays on its line, and memleak's go on the
    // next.
    assert!(lines.iter().any(|l| l == "RESULT"), "{text}");
    let summary = lines
        .iter()
        .find(|l| l.starts_with("memleak: recorded "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(summary.contains(" s ("), "{summary}");
    assert!(summary.contains(" of memleak's CPU per event"), "{summary}");
    assert!(!summary.contains(" ns "), "{summary}");
    let last = lines.iter().rfind(|l| !l.is_empty()).unwrap();
    assert_eq!(
        last,
        &format!("memleak: next: memleak analyze {}", trace.display())
    );
}
