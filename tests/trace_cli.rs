//! `memleak info` on good and bad traces: what it prints, its exit code, and
//! the one-line `memleak: error:` it gives for every bad input.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use memleak_trace::{Event, EventKind, Meta, StackRecord, TraceWriter, WriterOptions};

fn memleak(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memleak"))
        .args(args)
        .output()
        .expect("run memleak")
}

fn info(path: &Path, json: bool) -> Output {
    let mut args = vec![std::ffi::OsStr::new("info"), path.as_os_str()];
    if json {
        args.push("--json".as_ref());
    }
    memleak(&args)
}

fn events(n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| Event {
            ts_ns: 5_000_000_000 + i as u64 * 2_000,
            pid: 321,
            tid: 321 + (i % 2) as u32,
            kind: if i % 3 == 2 {
                EventKind::Free
            } else {
                EventKind::Malloc
            },
            addr: 0x1000 + i as u64 * 64,
            size: if i % 3 == 2 { 0 } else { 48 },
            old_addr: None,
            old_size: None,
            stack_id: (i % 3 != 2).then_some(1),
        })
        .collect()
}

/// A finished trace of `n` events in segments of `segment_rows`.
fn write(root: &Path, n: usize, segment_rows: usize) {
    let mut meta = Meta::for_this_host("0.1.0-test");
    meta.command = vec![
        "memleak".into(),
        "record".into(),
        "--".into(),
        "./seed".into(),
    ];
    meta.pids = vec![321];
    meta.end_ns = meta.start_ns + 2_500_000_000;
    meta.exit_code = Some(0);
    meta.counters.lost.insert("ring_full".into(), 7);
    let opts = WriterOptions {
        segment_rows,
        row_group_rows: 10,
        // Keep the segments apart: several of them are what is tested.
        merge_segments: 0,
        ..WriterOptions::default()
    };
    let mut w = TraceWriter::create(root, meta, opts).unwrap();
    w.push_stack(&StackRecord {
        stack_id: 1,
        pid: 321,
        kernel: false,
        truncated: false,
        frames: vec![0x401000],
    })
    .unwrap();
    for e in events(n) {
        w.push_event(&e).unwrap();
    }
    w.finish().unwrap();
}

fn segments(root: &Path, table: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root.join(table))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    v.sort();
    v
}

fn truncate_half(path: &Path) {
    let len = std::fs::metadata(path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
}

/// Asserts a failed run: non-zero exit, nothing on stdout, and stderr one
/// line starting with `memleak: error:` that contains `needle`.
fn assert_fails(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit status {} for stderr {stderr:?}",
        out.status
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "stderr is not one line: {stderr:?}"
    );
    assert!(stderr.starts_with("memleak: error: "), "{stderr:?}");
    assert!(stderr.contains(needle), "{stderr:?} lacks {needle:?}");
    assert!(
        out.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn info_describes_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    let out = info(&root, false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "format:    memleak-trace 1.6 (written by memleak 0.1.0-test)",
        "command:   memleak record -- ./seed",
        "pids:      321",
        "duration:  2.500 s",
        "complete:  yes (traced command exited with 0)",
        "events     90",
        "  malloc           60",
        "  free             30",
        "lost       7",
        "  ring_full            7",
    ] {
        // Compare with runs of spaces squeezed: the alignment may change.
        let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let lines: Vec<String> = stdout.lines().map(squeeze).collect();
        assert!(
            lines.iter().any(|l| l.contains(&squeeze(needle))),
            "{needle:?} not in\n{stdout}"
        );
    }
    let events_line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("events ") && l.starts_with(' '))
        .unwrap();
    let cols: Vec<&str> = events_line.split_whitespace().collect();
    assert_eq!(&cols[..4], ["events", "3", "90", "9"], "{events_line}");
    assert!(
        stdout.contains("start:     20"),
        "wall-clock start in\n{stdout}"
    );
}

#[test]
fn info_json_is_machine_readable() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    let out = info(&root, true);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(v["format_version"], "1.6");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["exit_signal"], serde_json::Value::Null);
    assert_eq!(v["exit_core_dumped"], false);
    assert_eq!(v["complete"], true);
    assert_eq!(v["pids"], serde_json::json!([321]));
    assert_eq!(v["events_total"], 90);
    assert_eq!(v["events"]["malloc"], 60);
    assert_eq!(v["lost"]["ring_full"], 7);
    assert_eq!(v["tables"]["events"]["segments"], 3);
    assert_eq!(v["tables"]["events"]["rows"], 90);
    assert_eq!(v["tables"]["stacks"]["rows"], 1);
    assert_eq!(v["duration_s"], 2.5);
    assert_eq!(v["warnings"], serde_json::json!([]));
}

#[test]
fn empty_trace_reports_zero_events() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("empty.parquet");
    TraceWriter::create(&root, Meta::default(), WriterOptions::default())
        .unwrap()
        .finish()
        .unwrap();
    let out = info(&root, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events_total"], 0);
    assert_eq!(v["tables"]["events"]["rows"], 0);
    let text = info(&root, false);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("events     0"));
}

#[test]
fn truncated_listed_segment_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    let seg = segments(&root, "events")[2].clone();
    truncate_half(&seg);
    assert_fails(&info(&root, false), "truncated or altered");
    assert_fails(&analyze(&root, &[]), "part-00002.parquet: corrupt (");
}

#[test]
fn truncated_last_segment_of_a_format_1_0_trace_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    as_format_1_0(&root);
    truncate_half(&segments(&root, "events")[2]);
    let out = info(&root, true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("memleak: warning: "), "{stderr}");
    assert!(
        stderr.contains("part-00002.parquet: skipping truncated last segment"),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tables"]["events"]["rows"], 80);
}

#[test]
fn missing_path_fails() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("nope.parquet");
    assert_fails(&info(&p, false), "nope.parquet: no such file or directory");
}

#[test]
fn directory_that_is_not_a_trace_fails() {
    let dir = tempfile::tempdir().unwrap();
    assert_fails(
        &info(dir.path(), false),
        "not a memleak trace (no meta.json)",
    );
    let f = dir.path().join("file.txt");
    std::fs::write(&f, "text").unwrap();
    assert_fails(&info(&f, false), "not a memleak trace (not a directory)");
}

#[test]
fn garbage_meta_json_fails() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 10, 100);
    std::fs::write(root.join("meta.json"), "{{{ not json").unwrap();
    assert_fails(&info(&root, false), "meta.json: corrupt (invalid JSON");
}

#[test]
fn newer_major_version_fails() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 10, 100);
    let path = root.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    meta["format_version"] = "3.1".into();
    // Edited by hand: without the checksum of the values it had.
    meta.as_object_mut().unwrap().remove("meta_crc32");
    std::fs::write(&path, serde_json::to_string_pretty(&meta).unwrap()).unwrap();
    assert_fails(
        &info(&root, false),
        "trace format 3.1 is newer than this memleak supports (1.x); upgrade memleak",
    );
}

#[test]
fn corrupt_segment_fails() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    truncate_half(&segments(&root, "events")[0]);
    assert_fails(&info(&root, false), "part-00000.parquet: corrupt (");
}

#[test]
fn foreign_parquet_fails() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 10, 100);
    // A lone Parquet file instead of a trace directory.
    let seg = segments(&root, "events")[0].clone();
    assert_fails(
        &info(&seg, false),
        "foreign Parquet file (a single Parquet file",
    );
    // A segment of another table in place of a listed one: meta.json's
    // length and checksum catch it.
    std::fs::copy(&segments(&root, "stacks")[0], &seg).unwrap();
    assert_fails(&info(&root, false), "meta.json lists");
    // In a format 1.0 trace, which lists nothing, the table tag does.
    as_format_1_0(&root);
    assert_fails(
        &info(&root, false),
        "foreign Parquet file (a memleak stacks segment in the events directory)",
    );
}

/// Makes a trace look like one of format 1.0, whose meta.json lists no
/// segments and has no checksum.
fn as_format_1_0(root: &Path) {
    let path = root.join("meta.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let o = v.as_object_mut().unwrap();
    for k in ["segments", "meta_crc32", "checkpoint_ns"] {
        o.remove(k);
    }
    o.insert("format_version".into(), "1.0".into());
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

fn analyze(path: &Path, extra: &[&str]) -> Output {
    let mut args = vec![std::ffi::OsStr::new("analyze"), path.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    args.push("-q".as_ref());
    memleak(&args)
}

/// Options that cannot make sense are refused with one line naming the
/// rule, before anything is replayed.
#[test]
fn analyze_refuses_contradictory_options() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    for (args, needle) in [
        (
            &["--from", "2s", "--to", "1s"][..],
            "--from (2s) is not before --to (1s)",
        ),
        (&["--from", "1s", "--to", "1000ms"], "is not before --to"),
        (
            &["--min-size", "1k", "--max-size", "100"],
            "--min-size (1024) is larger than --max-size (100)",
        ),
        (&["-j", "0"], "invalid value '0' for '--jobs <N>'"),
        (
            &["--min-size", "12q"],
            r#"invalid size "12q": unknown unit "q" (use k, M, G)"#,
        ),
        (
            &["--older-than", "5parsecs"],
            r#"unknown unit "parsecs" (use ns, us, ms, s, m, h)"#,
        ),
        (
            &["--at", "3s"],
            "--at 3s is past the end of the recording, which is 2.500s long",
        ),
        (&["--at", "2.6"], "past the end of the recording"),
    ] {
        let out = analyze(&root, args);
        assert_fails(&out, needle);
    }
    // The limits themselves are fine; a bare number is seconds.
    for args in [
        &["--at", "2.5"][..],
        &["--at", "2500ms", "--from", "0", "--to", "1ns"],
        &["--min-size", "48", "--max-size", "48", "-j", "1"],
        &["--min-size", "1K", "--max-size", "1kib"],
    ] {
        let out = analyze(&root, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// An `--older-than` longer than the recording selects nothing: a
/// warning says so, and which unit a bare number was read in (bcc's `-o`
/// took milliseconds); the report is still written.
#[test]
fn older_than_longer_than_the_recording_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    let run = |age: &str| {
        let out = analyze(&root, &["--older-than", age]);
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (_, err) = run("5000");
    let warning = err
        .lines()
        .find(|l| l.starts_with("memleak: warning: --older-than"))
        .unwrap_or_else(|| panic!("no warning: {err}"));
    assert!(
        warning.contains(
            "--older-than 5000 (read as 5000 seconds: a number without a unit is seconds; \
             write 5000ms for milliseconds) is longer than the recording"
        ),
        "{warning}"
    );
    assert!(warning.contains("which is 2.500s long"), "{warning}");
    // With a unit, nothing is assumed.
    let (_, err) = run("3s");
    assert!(
        err.contains("--older-than 3s is longer than the recording") && !err.contains("read as"),
        "{err}"
    );
    // Within the recording, and a bare number that is, no warning.
    for age in ["2", "2500ms"] {
        let (_, err) = run(age);
        assert!(!err.contains("--older-than"), "{age}: {err}");
    }
}

/// A trace whose recorder never finished has no end in its meta: its
/// length is up to its last event.
#[test]
fn at_past_the_last_event_of_an_unfinished_trace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    let mut meta = Meta::for_this_host("0.1.0-test");
    meta.start_ns = 4_000_000_000; // events start one second later
    let mut w = TraceWriter::create(&root, meta, WriterOptions::default()).unwrap();
    for e in events(90) {
        w.push_event(&e).unwrap();
    }
    w.finish().unwrap();
    let path = root.join("meta.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["end_ns"] = 0.into();
    // Edited by hand: without the checksum of the values it had.
    v.as_object_mut().unwrap().remove("meta_crc32");
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    // The last event is at 5.000178 s: the recording is 1.000178 s long.
    assert_fails(
        &analyze(&root, &["--at", "1001ms"]),
        "--at 1001ms is past the end of the recording, which is 1.000s long",
    );
    let out = analyze(&root, &["--at", "1000ms"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs memleak with stdout going to `stdout`.
fn run_to(args: &[&std::ffi::OsStr], stdout: std::process::Stdio) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memleak"))
        .args(args)
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run memleak")
        .wait_with_output()
        .unwrap()
}

/// The commands that print to stdout: info (text and JSON) and analyze
/// (text, JSON, folded).
fn printing_commands(root: &Path) -> Vec<Vec<std::ffi::OsString>> {
    let mut out = Vec::new();
    for extra in [&[][..], &["--json"]] {
        let mut args: Vec<std::ffi::OsString> = vec!["info".into(), root.into()];
        args.extend(extra.iter().map(Into::into));
        out.push(args);
    }
    for format in ["text", "json", "folded"] {
        out.push(vec![
            "analyze".into(),
            root.into(),
            "-q".into(),
            "--format".into(),
            format.into(),
        ]);
    }
    out
}

/// `> /dev/full`: one line naming the error, status 1, no panic.
#[test]
fn full_disk_on_stdout_is_one_error_line() {
    if !Path::new("/dev/full").exists() {
        common::skip("no /dev/full");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    for args in printing_commands(&root) {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let out = run_to(&args, full.into());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(
            stderr, "memleak: error: writing to stdout: No space left on device\n",
            "{args:?}"
        );
    }
}

/// `| true`: the reader is gone before the first write. memleak stops
/// quietly with 141, as if killed by SIGPIPE, rather than panicking.
#[test]
fn closed_stdout_pipe_ends_quietly() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    for args in printing_commands(&root) {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two new descriptors, owned below.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors nobody else owns.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read);
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let out = run_to(&args, write.into());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

fn diff(base: &Path, new: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        std::ffi::OsStr::new("diff"),
        base.as_os_str(),
        new.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    args.push("-q".as_ref());
    memleak(&args)
}

/// `memleak diff` names the side whose trace is bad, in one line, and
/// refuses options as `analyze` does.
#[test]
fn diff_of_a_bad_trace_fails_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.parquet");
    write(&good, 90, 40);
    let missing = dir.path().join("nope.parquet");
    assert_fails(&diff(&missing, &good, &[]), "base trace: ");
    assert_fails(&diff(&good, &missing, &[]), "new trace: ");
    assert_fails(
        &diff(&good, &missing, &[]),
        "nope.parquet: no such file or directory",
    );

    let garbage = dir.path().join("garbage.parquet");
    write(&garbage, 10, 100);
    std::fs::write(garbage.join("meta.json"), "{{{ not json").unwrap();
    assert_fails(
        &diff(&good, &garbage, &[]),
        "meta.json: corrupt (invalid JSON",
    );

    let truncated = dir.path().join("truncated.parquet");
    write(&truncated, 90, 40);
    truncate_half(&segments(&truncated, "events")[2]);
    assert_fails(
        &diff(&truncated, &good, &[]),
        "part-00002.parquet: corrupt (",
    );

    assert_fails(
        &diff(&good, &good, &["--min-size", "1k", "--max-size", "100"]),
        "--min-size (1024) is larger than --max-size (100)",
    );
    assert_fails(
        &diff(&good, &good, &["--at", "3s"]),
        "--at 3s is past the end of the recording",
    );
    // A trace against itself: no change.
    let out = diff(&good, &good, &["--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["summary"]["unchanged"], 1);
    assert_eq!(v["summary"]["delta_bytes"], 0);
    assert_eq!(v["stacks"][0]["base"]["bytes"], 48 * 60);
}

/// Asserts a failed run whose whole stderr is `line`.
fn assert_fails_with(out: &Output, line: &str) {
    assert!(!out.status.success(), "exit status {}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stderr), format!("{line}\n"));
    assert!(out.stdout.is_empty());
}

/// Files of `dir` that look like a temporary memleak left behind.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".memleak-"))
        .collect()
}

/// `ln -s /etc/passwd r.html; memleak analyze T -o r.html` must not
/// overwrite /etc/passwd: a symbolic link at the output is refused in one
/// line, for every format, `--format all`'s directory and `diff -o`, and
/// neither it nor what it points to is touched.
#[test]
fn reports_are_not_written_through_a_symbolic_link() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = d.join("t.parquet");
    write(&root, 90, 40);
    let victim = d.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let victim_dir = d.join("victim.d");
    std::fs::create_dir(&victim_dir).unwrap();
    let link = |name: &str, to: &Path| {
        let p = d.join(name);
        std::os::unix::fs::symlink(to, &p).unwrap();
        p
    };
    let mut runs: Vec<(PathBuf, Output)> = Vec::new();
    for format in ["text", "json", "folded", "svg", "pprof", "html"] {
        let out = link(&format!("r.{format}"), &victim);
        let run = analyze(&root, &["--format", format, "-o", out.to_str().unwrap()]);
        runs.push((out, run));
    }
    let all = link("all", &victim_dir);
    runs.push((
        all.clone(),
        analyze(&root, &["--format", "all", "-o", all.to_str().unwrap()]),
    ));
    let diff_out = link("d.txt", &victim);
    runs.push((
        diff_out.clone(),
        diff(&root, &root, &["-o", diff_out.to_str().unwrap()]),
    ));
    // A dangling link: nothing is created where it points.
    let nowhere = d.join("nowhere");
    let dangling = link("dangling.html", &nowhere);
    runs.push((
        dangling.clone(),
        analyze(
            &root,
            &["--format", "html", "-o", dangling.to_str().unwrap()],
        ),
    ));
    for (path, out) in &runs {
        assert_fails_with(
            out,
            &format!(
                "memleak: error: {}: is a symbolic link; not writing through it",
                path.display()
            ),
        );
        assert!(path.symlink_metadata().unwrap().file_type().is_symlink());
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(std::fs::read_dir(&victim_dir).unwrap().count(), 0);
    assert!(!nowhere.exists());
    assert!(temporaries(d).is_empty(), "{:?}", temporaries(d));
}

/// Reports may hold leaked bytes (`--scan-contents`): a new one is
/// private (0600) like the trace; one that replaces a file of ours keeps
/// that file's mode. Either way the file is replaced whole, by a rename:
/// a hard link to the old file keeps the old contents, and no temporary
/// is left behind.
#[test]
fn reports_are_private_and_replaced_by_a_rename() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = d.join("t.parquet");
    write(&root, 90, 40);
    let mode = |p: &Path| p.metadata().unwrap().mode() & 0o7777;
    let ok = |out: Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    let new = d.join("new.txt");
    ok(analyze(&root, &["-o", new.to_str().unwrap()]));
    assert_eq!(mode(&new), 0o600);
    assert!(std::fs::read_to_string(&new)
        .unwrap()
        .contains("outstanding"));

    let shared = d.join("shared.json");
    std::fs::write(&shared, "old report\n").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    let old = d.join("old.json");
    std::fs::hard_link(&shared, &old).unwrap();
    let ino = shared.metadata().unwrap().ino();
    ok(analyze(
        &root,
        &["--format", "json", "-o", shared.to_str().unwrap()],
    ));
    assert_eq!(mode(&shared), 0o644, "the replaced file's mode is kept");
    assert_ne!(
        shared.metadata().unwrap().ino(),
        ino,
        "replaced, not rewritten"
    );
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "old report\n");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&shared).unwrap()).expect("a whole JSON report");
    assert!(v.get("summary").is_some());

    let all = d.join("all");
    ok(analyze(
        &root,
        &["--format", "all", "-o", all.to_str().unwrap()],
    ));
    assert_eq!(mode(&all), 0o700);
    let files: Vec<PathBuf> = std::fs::read_dir(&all)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 6, "{files:?}");
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }

    let d_txt = d.join("d.txt");
    ok(diff(&root, &root, &["-o", d_txt.to_str().unwrap()]));
    assert_eq!(mode(&d_txt), 0o600);
    assert!(temporaries(d).is_empty(), "{:?}", temporaries(d));
    assert!(temporaries(&all).is_empty(), "{:?}", temporaries(&all));
}

/// An OS error is said once, in the system's words: not "Read-only file
/// system (os error 30): Read-only file system (os error 30)".
#[test]
fn os_errors_are_said_once_in_the_systems_words() {
    let Some(ro) = common::Tmpfs::read_only() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    let r = ro.path().join("r.txt");
    assert_fails_with(
        &analyze(&root, &["-o", r.to_str().unwrap()]),
        &format!("memleak: error: {}: Read-only file system", r.display()),
    );
    let all = ro.path().join("all");
    assert_fails_with(
        &analyze(&root, &["--format", "all", "-o", all.to_str().unwrap()]),
        &format!("memleak: error: {}: Read-only file system", all.display()),
    );
    assert_fails_with(
        &diff(&root, &root, &["-o", r.to_str().unwrap()]),
        &format!("memleak: error: {}: Read-only file system", r.display()),
    );

    // A trace another user cannot read (the trace directory is 0700).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_memleak"))
        .arg("info")
        .arg(&root)
        .output()
        .expect("setpriv (util-linux) runs");
    assert_fails_with(
        &out,
        &format!(
            "memleak: error: {}: Permission denied",
            root.join("meta.json").display()
        ),
    );
}

/// The `complete:` line of `info`, and its JSON.
fn exit_lines(root: &Path) -> (String, serde_json::Value) {
    let out = info(root, false);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with("complete:"))
        .unwrap_or_else(|| panic!("no complete: line in\n{text}"))
        .to_string();
    let json = serde_json::from_slice(&info(root, true).stdout).unwrap();
    (line, json)
}

/// A command killed by a signal is said to be, not to have "exited with
/// 139"; `info --json` adds the signal beside the shell's status.
#[test]
fn info_says_a_death_by_signal() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 10, 100);
    let path = root.join("meta.json");
    let mut m = Meta::load(&root).unwrap();
    m.exit_code = Some(139);
    m.exit_signal = Some(libc::SIGSEGV);
    m.exit_core_dumped = true;
    m.store(&root).unwrap();
    let (line, v) = exit_lines(&root);
    assert_eq!(
        line,
        "complete:  yes (traced command was killed by signal 11 (SIGSEGV) (core dumped))"
    );
    assert_eq!(v["exit_code"], 139);
    assert_eq!(v["exit_signal"], 11);
    assert_eq!(v["exit_signal_name"], "SIGSEGV");
    assert_eq!(v["exit_core_dumped"], true);

    // A trace from before format 1.4 stored 128 + the signal only: info
    // does not pretend to know which it was.
    let mut old: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let o = old.as_object_mut().unwrap();
    for k in ["exit_signal", "exit_core_dumped", "meta_crc32"] {
        o.remove(k);
    }
    o.insert("format_version".into(), "1.3".into());
    o.insert("exit_code".into(), 137.into());
    std::fs::write(&path, serde_json::to_string_pretty(&old).unwrap()).unwrap();
    let (line, v) = exit_lines(&root);
    assert_eq!(
        line,
        "complete:  yes (traced command exited with 137, or was killed by signal 9 (SIGKILL): \
         traces before format 1.4 do not say which)"
    );
    assert_eq!(v["exit_code"], 137);
    assert_eq!(v["exit_signal"], serde_json::Value::Null);
}

/// The help of every replaying command: options under headings, 3 to 5
/// examples that run, every value of every enum option listed, and no
/// path into the source tree an installed binary does not have.
#[test]
fn help_has_headings_examples_and_every_value() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t.parquet");
    write(&root, 90, 40);
    for (cmd, headings) in [
        (
            "analyze",
            &[
                "Output:",
                "Filters and evaluation time:",
                "Suppressions:",
                "Running:",
            ][..],
        ),
        (
            "diff",
            &[
                "Output:",
                "Matching stacks and processes:",
                "Filters and evaluation time:",
            ],
        ),
        ("info", &[]),
        ("sql", &[]),
    ] {
        for flag in ["-h", "--help"] {
            let out = memleak(&[cmd.as_ref(), flag.as_ref()]);
            assert!(out.status.success(), "{cmd} {flag}");
            let help = String::from_utf8(out.stdout).unwrap();
            for h in headings {
                assert!(
                    help.lines().any(|l| l == *h),
                    "{cmd} {flag}: no {h}\n{help}"
                );
            }
            assert!(
                !help.contains("docs/"),
                "{cmd} {flag} names a source path\n{help}"
            );
            let examples: Vec<&str> = help
                .split("Examples:\n")
                .nth(1)
                .unwrap_or_else(|| panic!("{cmd} {flag}: no examples\n{help}"))
                .lines()
                .take_while(|l| l.starts_with("  "))
                .collect();
            assert!((3..=5).contains(&examples.len()), "{cmd}: {examples:?}");
            if flag == "-h" {
                for name in ["--format", "--sort", "--group-by", "--weight", "--kind"] {
                    if let Some(l) = help.lines().find(|l| l.contains(&format!("{name} <"))) {
                        assert!(l.contains("[possible values: "), "{cmd}: {l}");
                    }
                }
            }
            // --kind says each of its values, not "user, kernel or both".
            let kind = help
                .lines()
                .find(|l| l.contains("--kind <KIND>"))
                .filter(|_| flag == "-h");
            if let Some(l) = kind {
                let text = l.split("[default").next().unwrap();
                for v in ["user", "kernel", "heap", "mmap", "all"] {
                    assert!(text.contains(v), "{cmd} {flag}: --kind omits {v}: {l}");
                }
            }
            // Every example runs: a usage error exits with 2.
            let runnable = examples
                .iter()
                .filter(|l| l.starts_with(&format!("  memleak {cmd} ")));
            for e in runnable {
                let words: Vec<String> = e
                    .split(" #")
                    .next()
                    .unwrap()
                    .split(['|', '>', ';'])
                    .next()
                    .unwrap()
                    .split_whitespace()
                    .skip(1)
                    .map(|w| match w.ends_with(".parquet") {
                        true => root.to_str().unwrap().to_string(),
                        false => w.to_string(),
                    })
                    .collect();
                let words: Vec<&str> = words.iter().map(|w| w.as_str()).collect();
                let quiet = matches!(cmd, "analyze" | "diff").then_some("-q");
                let out = Command::new(env!("CARGO_BIN_EXE_memleak"))
                    .args(&words)
                    .args(quiet)
                    .current_dir(dir.path())
                    .output()
                    .unwrap();
                assert_ne!(
                    out.status.code(),
                    Some(2),
                    "{e}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}
