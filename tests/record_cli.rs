//! `memleak record`'s failures: each is one line on stderr starting with
//! `memleak: error:`, a non-zero exit, and no trace left behind.
#![cfg(feature = "bpf")]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::fixtures::{build_steady, fixtures_dir, memleak};
use common::one_line_error;
use common::procs::{
    become_subreaper, proc_state, reaped, running_command, wait_orphan, wait_within,
};

#[test]
fn missing_pid_is_refused() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = memleak()
        .args(["record", "-p", "999999", "-o"])
        .arg(dir.path().join("t"))
        .output()
        .unwrap();
    assert_eq!(
        one_line_error(&out),
        "memleak: error: no such process: 999999"
    );
    assert!(!dir.path().join("t").exists());
}

#[test]
fn existing_output_is_refused_without_force() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    std::fs::create_dir(&trace).unwrap();
    let out = memleak()
        .args(["record", "-o"])
        .arg(&trace)
        .args(["--", "true"])
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert!(
        line.ends_with("already exists (use --force to overwrite)"),
        "{line}"
    );
    assert!(trace.is_dir(), "the existing output must be left alone");
}

/// An OS error is said once, in the system's words.
#[test]
fn read_only_output_is_one_plain_error() {
    if !common::can_record() {
        return;
    }
    let Some(ro) = common::Tmpfs::read_only() else {
        return;
    };
    let trace = ro.path().join("t");
    let out = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        one_line_error(&out),
        format!("memleak: error: {}: Read-only file system", trace.display())
    );
}

#[test]
fn unknown_allocator_library_is_refused() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = memleak()
        .args(["record", "-O", "/nonexistent/libjemalloc.so", "-o"])
        .arg(dir.path().join("t"))
        .args(["--", "true"])
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert!(
        line.contains("/nonexistent/libjemalloc.so: cannot read allocator library"),
        "{line}"
    );
}

#[test]
fn missing_symbols_prefix_is_refused() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = memleak()
        .args(["record", "--symbols-prefix", "je_", "-o"])
        .arg(dir.path().join("t"))
        .args(["--", "true"])
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert!(
        line.contains("none of the allocator functions found"),
        "{line}"
    );
    assert!(!dir.path().join("t").exists(), "no empty trace left behind");
}

/// A statically linked program has no libc: its own malloc is probed,
/// found in its .symtab. Stripped, it has none: rather than a recording
/// that reports nothing, one line says so, the program does not run and
/// no trace is left.
#[test]
fn stripped_static_program_is_refused() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prog = fixtures_dir().join("seed_static_stripped");
    let out = memleak()
        .args(["record", "-o"])
        .arg(dir.path().join("t"))
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert_eq!(
        line,
        format!(
            "memleak: error: {} is statically linked and stripped: its malloc cannot be probed",
            prog.display()
        )
    );
    assert!(!dir.path().join("t").exists(), "no empty trace left behind");
}

/// `-p` with a process whose allocator is preloaded jemalloc: its malloc
/// is probed in jemalloc, where the calls go (probing libc's found none),
/// and the trace says so.
#[test]
fn attach_to_a_process_with_preloaded_jemalloc() {
    if !common::can_record() {
        return;
    }
    let je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    if !Path::new(je).exists() {
        common::skip(format_args!("{je} is not installed (libjemalloc2)"));
        return;
    }
    // Past pymalloc's 512-byte limit, so every iteration calls malloc.
    let mut target = Command::new("python3")
        .env("LD_PRELOAD", je)
        .args(["-c", "import time\nfor i in range(6000):\n    b = bytearray(1000 + i)\n    time.sleep(0.001)\n"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let out = memleak()
        .args([
            "record",
            "-q",
            "-d",
            "1s",
            "-p",
            &target.id().to_string(),
            "-o",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    let _ = target.kill();
    let _ = target.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = memleak_trace::Trace::open(&trace).unwrap();
    let meta = t.meta();
    assert!(
        meta.counters.events.get("malloc").copied().unwrap_or(0) > 100,
        "{:?}",
        meta.counters.events
    );
    assert!(
        meta.notes
            .iter()
            .any(|n| n.contains("malloc") && n.contains("libjemalloc.so.2")),
        "{:?}",
        meta.notes
    );
}

#[test]
fn command_that_cannot_run_is_refused() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = memleak()
        .args(["record", "-o"])
        .arg(dir.path().join("t"))
        .args(["--", "/nonexistent/prog"])
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert!(
        line.contains("cannot execute /nonexistent/prog: No such file or directory"),
        "{line}"
    );
}

#[test]
fn unprivileged_user_is_told_what_is_needed() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(env!("CARGO_BIN_EXE_memleak"))
        .args(["record", "-o"])
        .arg(dir.path().join("t"))
        .args(["--", "true"])
        .output()
        .expect("setpriv (util-linux) runs");
    let line = one_line_error(&out);
    assert!(
        line.contains("needs root (or CAP_BPF and CAP_PERFMON)"),
        "{line}"
    );
}

#[test]
fn exit_status_of_the_command_is_returned() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = memleak()
        .args(["record", "-q", "-o"])
        .arg(dir.path().join("t"))
        .args(["--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = memleak_trace::Trace::open(dir.path().join("t"))
        .unwrap()
        .meta()
        .clone();
    assert_eq!(meta.exit_code, Some(7));
    assert_eq!(meta.exit_signal, None);
    assert!(meta.complete);
}

/// A command that dies of a signal is said to, in record's summary, the
/// trace and `info`; record's own status is the shell's, 128 + 9.
#[test]
fn death_by_signal_is_said_as_such() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t");
    let out = memleak()
        .args(["record", "-o"])
        .arg(&trace)
        .args(["--", "sh", "-c", "kill -9 $$"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
    assert!(meta.complete);
    assert_eq!(meta.exit_code, Some(137));
    assert_eq!(meta.exit_signal, Some(libc::SIGKILL));
    assert!(!meta.exit_core_dumped);
    let pid = meta.pids[0];
    assert!(
        stderr.contains(&format!(
            "memleak: the command (pid {pid}) was killed by signal 9 (SIGKILL)\n"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("exited with"), "{stderr}");
    let info = memleak().arg("info").arg(&trace).output().unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        text.contains("complete:  yes (traced command was killed by signal 9 (SIGKILL))\n"),
        "{text}"
    );
    let json = memleak()
        .args(["info", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["exit_code"], 137);
    assert_eq!(v["exit_signal"], 9);
    assert_eq!(v["exit_signal_name"], "SIGKILL");
}

/// A full disk stops the recording cleanly: a one-line error, and every
/// segment closed before it stays readable. The tmpfs holds 256 KiB: the
/// `threads` fixture's trace takes 700 KiB to 1.8 MiB (it varies from run
/// to run; with 512 KiB a small run once fitted and the test failed).
#[test]
fn full_disk_keeps_closed_segments_valid() {
    if !common::can_record() {
        return;
    }
    let mnt = common::Tmpfs::mount("size=256k").expect("mounting a tmpfs needs root");
    let trace = mnt.path().join("t.parquet");
    let bench = fixtures_dir().join("threads");
    let out = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&bench)
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert!(line.contains("no space left on device"), "{line}");
    // What was closed is intact (possibly nothing but meta.json).
    let t = memleak_trace::Trace::open(&trace).expect("closed segments stay valid");
    for batch in t.events(memleak_trace::EventColumns::ALL).unwrap() {
        batch.expect("every closed segment decodes");
    }
    assert!(!trace.join(".meta.json.tmp").exists());
}

/// A disk full from the start: one error line, a non-zero exit, and
/// nothing left behind, not even an empty `.meta.json.tmp`.
#[test]
fn full_disk_at_the_start_leaves_nothing_behind() {
    if !common::can_record() {
        return;
    }
    let Some(fs) = common::Tmpfs::mount("size=64k") else {
        return;
    };
    let fill = fs.path().join("fill");
    let ok = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", fill.display()))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!ok.success(), "dd fills the tmpfs and fails");
    let trace = fs.path().join("t.parquet");
    let out = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .args(["--", "true"])
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert!(line.contains("no space left on device"), "{line}");
    let left: Vec<_> = std::fs::read_dir(fs.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["fill"], "left behind: {left:?}");
}

/// The path of a trace's lock file (docs/format.md).
fn lock_file(trace: &Path) -> std::path::PathBuf {
    trace.join(".memleak.lock")
}

/// A trace being recorded is locked: a second `record -o` of it, with
/// --force or without, is refused in one line naming the recorder's pid;
/// `info` and `analyze` read it meanwhile without waiting; the first
/// recording ends complete and intact.
#[test]
fn a_trace_being_recorded_is_refused_to_a_second_recorder() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let steady = build_steady(dir.path());
    let trace = dir.path().join("t.parquet");
    let mut rec = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&steady)
        .args(["2000", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = running_command(&mut rec, "steady");
    for force in [true, false] {
        let mut second = memleak();
        second.args(["record", "-q"]);
        if force {
            second.arg("--force");
        }
        let out = second
            .arg("-o")
            .arg(&trace)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(
            one_line_error(&out),
            format!(
                "memleak: error: {}: another memleak (pid {}) is recording to it; not touching it",
                trace.display(),
                rec.id()
            ),
            "--force: {force}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(lock_file(&trace)).unwrap(),
        format!("{}\n", rec.id())
    );
    for cmd in ["info", "analyze"] {
        let mut reader = memleak()
            .arg(cmd)
            .arg(&trace)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let status = wait_within(&mut reader, 30, &format!("{cmd} of a trace being recorded"));
        assert!(
            status.success(),
            "{cmd} of a trace being recorded: {status:?}"
        );
    }
    let status = wait_within(&mut rec, 60, "the first recording");
    assert!(status.success(), "{status:?}");
    assert!(reaped(pid));
    let t = memleak_trace::Trace::open(&trace).unwrap();
    assert!(t.meta().complete);
    assert!(t.warnings().is_empty(), "{:?}", t.warnings());
    assert!(t
        .meta()
        .counters
        .events
        .get("malloc")
        .is_some_and(|&n| n > 0));
    for batch in t.events(memleak_trace::EventColumns::ALL).unwrap() {
        batch.expect("every segment decodes");
    }
    assert!(
        !lock_file(&trace).exists(),
        "a complete trace keeps no lock file"
    );
}

/// `kill -9` of a recorder leaves its lock file, which locks nothing (the
/// lock died with the process): a later --force replaces the trace.
#[test]
fn a_killed_recorders_lock_file_does_not_block_force() {
    if !common::can_record() {
        return;
    }
    become_subreaper();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let mut rec = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .args(["--", "sleep", "100"])
        .spawn()
        .unwrap();
    let pid = running_command(&mut rec, "sleep");
    rec.kill().unwrap(); // SIGKILL
    wait_within(&mut rec, 5, "memleak after SIGKILL");
    if wait_orphan(pid, 5).is_none() {
        // SAFETY: the orphaned command, ours since memleak died.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        wait_orphan(pid, 5);
        panic!("the command outlived memleak");
    }
    assert_eq!(
        std::fs::read_to_string(lock_file(&trace)).unwrap(),
        format!("{}\n", rec.id()),
        "the lock file names the killed recorder"
    );
    // Without --force: there, not locked.
    let out = memleak()
        .args(["record", "-q", "-o"])
        .arg(&trace)
        .args(["--", "true"])
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert!(
        line.ends_with("already exists (use --force to overwrite)"),
        "{line}"
    );
    let out = memleak()
        .args(["record", "-q", "--force", "-o"])
        .arg(&trace)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = memleak_trace::Trace::open(&trace).unwrap();
    assert!(t.meta().complete);
    assert!(!lock_file(&trace).exists());
}

/// Attaching to a running process by pid, stopped by --duration while the
/// target keeps running: a complete trace with the target's allocations.
#[test]
fn attach_to_a_running_process() {
    if !common::can_record() {
        return;
    }
    // Blocks past pymalloc's 512-byte limit, so every iteration calls
    // malloc: with 100 + i bytes the first ~400 did not, and on a loaded
    // machine the recorded second held exactly 100 calls once. Now about
    // 900 a second here.
    let mut target = Command::new("python3")
        .args(["-c", "import time\nfor i in range(6000):\n    b = bytearray(1000 + i)\n    time.sleep(0.001)\n"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let out = memleak()
        .args([
            "record",
            "-q",
            "-d",
            "1s",
            "-p",
            &target.id().to_string(),
            "-o",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        target.try_wait().unwrap().is_none(),
        "the target must keep running"
    );
    let _ = target.kill();
    let _ = target.wait();
    let t = memleak_trace::Trace::open(&trace).unwrap();
    let meta = t.meta();
    assert!(meta.complete);
    assert_eq!(meta.pids, vec![target.id()]);
    assert!(
        meta.counters.events.get("malloc").copied().unwrap_or(0) > 100,
        "{:?}",
        meta.counters.events
    );
    assert!(!t.stacks().unwrap().is_empty());
}

/// SIGINT and SIGTERM to memleak are passed on to the command, which is
/// recorded until it exits: a closed trace with its exit status, which is
/// memleak's too.
#[test]
fn signals_are_passed_on_and_close_a_valid_trace() {
    if !common::can_record() {
        return;
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.parquet");
        let mut rec = memleak()
            .args(["record", "-q", "-o"])
            .arg(&trace)
            .args(["--", "sleep", "100"])
            .spawn()
            .unwrap();
        // Once the command runs, memleak's handler is in place.
        let pid = running_command(&mut rec, "sleep");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(rec.id() as i32, sig) };
        let status = wait_within(&mut rec, 10, "memleak record after a signal");
        assert_eq!(status.code(), Some(128 + sig), "signal {sig}");
        let t = memleak_trace::Trace::open(&trace).unwrap();
        assert!(t.meta().complete, "signal {sig}: trace not closed");
        assert!(t.warnings().is_empty(), "{:?}", t.warnings());
        assert_eq!(t.meta().exit_code, Some(128 + sig), "signal {sig}");
        assert_eq!(t.meta().exit_signal, Some(sig), "signal {sig}");
        assert!(reaped(pid), "signal {sig}: the command is still there");
    }
}

/// A ring buffer too small for the event rate loses events: they are
/// counted by reason, stored in the trace, and shown by analyze, never
/// hidden.
#[test]
fn lost_events_are_counted_and_reported() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let out = memleak()
        .args([
            "record",
            "--capture",
            "bpf",
            "--ring-size",
            "65536",
            "--poll-ms",
            "200",
            "-o",
        ])
        .arg(&trace)
        .arg("--")
        .arg(fixtures_dir().join("threads"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let t = memleak_trace::Trace::open(&trace).unwrap();
    let lost = t
        .meta()
        .counters
        .lost
        .get("ring_full")
        .copied()
        .unwrap_or(0);
    assert!(lost > 0, "a 64 KiB ring drained every 200 ms must overflow");
    assert!(stderr.contains(&format!("lost {lost} events")), "{stderr}");
    let report = memleak().arg("analyze").arg(&trace).output().unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains(&format!("lost events       {lost}: ring_full {lost}")),
        "{text}"
    );
}

/// Runs `memleak record ARGS -o TRACE -- COMMAND` to its end, with
/// stderr in a file: a command left running would hold a pipe open.
/// Returns the status, stderr and the meta. The 60 s deadline only
/// catches a hang: the commands run longer than that (`sleep 100`) unless
/// memleak ends them or leaves them running (`--detach`).
fn record_until_done(
    dir: &Path,
    args: &[&str],
    command: &[&str],
) -> (std::process::ExitStatus, String, memleak_trace::Meta) {
    let trace = dir.join("t.parquet");
    let err_path = dir.join("stderr");
    let mut rec = memleak()
        .arg("record")
        .args(args)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .args(command)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let status = wait_within(&mut rec, 60, "memleak record");
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    let t = memleak_trace::Trace::open(&trace).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert!(t.meta().complete, "{stderr}");
    (status, stderr, t.meta().clone())
}

/// -d: the command is sent SIGTERM, recorded until it exits, and waited
/// for; sizes and durations take units.
#[test]
fn duration_ends_the_command_with_sigterm() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (status, stderr, meta) = record_until_done(
        dir.path(),
        &[
            "-d",
            "1s",
            "-z",
            "1",
            "-Z",
            "1G",
            "--ring-size",
            "1M",
            "--poll-ms",
            "20",
        ],
        &["sleep", "100"],
    );
    // Ended by memleak's SIGTERM, not by its own end 100 s later.
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert_eq!(meta.exit_code, Some(143));
    assert_eq!(meta.exit_signal, Some(libc::SIGTERM));
    let pid = meta.pids[0];
    assert!(
        reaped(pid),
        "the command ({pid}) is still there: {:?}",
        proc_state(pid)
    );
    assert!(
        stderr.contains(&format!(
            "memleak: sent SIGTERM to the command (pid {pid}) after --duration 1s; \
             it was killed by signal 15 (SIGTERM)"
        )),
        "{stderr}"
    );
    assert_eq!(meta.options["min_size"], 1);
    assert_eq!(meta.options["max_size"], 1u64 << 30);
    assert_eq!(meta.options["ring_size"], 1 << 20);
}

/// A command that ignores SIGTERM is killed --kill-after later.
#[test]
fn kill_after_kills_a_command_that_ignores_sigterm() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (status, stderr, meta) = record_until_done(
        dir.path(),
        &["-d", "1s", "--kill-after", "1s"],
        &[
            "sh",
            "-c",
            // The ignored signal stays ignored across exec.
            "trap '' TERM; exec sleep 100",
        ],
    );
    // Killed by --kill-after's SIGKILL, having ignored the SIGTERM.
    assert_eq!(status.code(), Some(137), "{stderr}");
    assert_eq!(meta.exit_code, Some(137));
    assert_eq!(meta.exit_signal, Some(libc::SIGKILL));
    assert!(reaped(meta.pids[0]));
    assert!(
        stderr.contains(
            "after --duration 1s, then SIGKILL after --kill-after 1s; \
             it was killed by signal 9 (SIGKILL)"
        ),
        "{stderr}"
    );
}

/// --detach: recording stops, the command runs on, untraced and not
/// stopped.
#[test]
fn detach_leaves_the_command_running() {
    if !common::can_record() {
        return;
    }
    become_subreaper();
    let dir = tempfile::tempdir().unwrap();
    let (status, stderr, meta) =
        record_until_done(dir.path(), &["--detach", "-d", "1s"], &["sleep", "100"]);
    let pid = meta.pids[0];
    let state = proc_state(pid);
    let tracer = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:").map(|v| v.trim().to_string()));
    // SAFETY: the orphaned command, ours since memleak exited.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let reaped = wait_orphan(pid, 5);
    assert!(status.success(), "{stderr}");
    assert_eq!(
        state,
        Some('S'),
        "the command must be running (sleeping), not stopped"
    );
    assert_eq!(
        tracer.as_deref(),
        Some("0"),
        "the command must not be traced"
    );
    assert!(
        reaped.is_some(),
        "the command did not come to us to be reaped"
    );
    assert_eq!(meta.exit_code, None);
    assert!(
        stderr.contains(&format!(
            "memleak: --detach: the command (pid {pid}) keeps running"
        )),
        "{stderr}"
    );
}

/// --detach while the threads are being stopped in ld.so all the time (the
/// `_dl_debug_state` probe sends SIGSTOP): no thread is left stopped.
#[test]
fn detach_leaves_no_thread_stopped() {
    if !common::can_record() {
        return;
    }
    become_subreaper();
    let dir = tempfile::tempdir().unwrap();
    let churn = fixtures_dir().join("dl_churn");
    let (status, stderr, meta) = record_until_done(
        dir.path(),
        &["--detach", "-d", "1s"],
        &[churn.to_str().unwrap()],
    );
    let pid = meta.pids[0];
    // A stop caused by a SIGSTOP left queued comes at once: wait a little.
    std::thread::sleep(Duration::from_millis(300));
    let states: Vec<char> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|tid| {
                    let stat =
                        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
                    stat.rsplit_once(')')?.1.trim_start().chars().next()
                })
                .collect()
        })
        .unwrap_or_default();
    // SAFETY: the orphaned command, ours since memleak exited.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_orphan(pid, 5);
    assert!(status.success(), "{stderr}");
    assert_eq!(states.len(), 4, "threads: {states:?}");
    assert!(
        states.iter().all(|s| !matches!(s, 'T' | 't')),
        "stopped threads: {states:?}"
    );
}

/// `kill -9` of memleak takes the command with it (PR_SET_PDEATHSIG):
/// it is not left running untraced.
#[test]
fn command_dies_with_memleak() {
    if !common::can_record() {
        return;
    }
    become_subreaper();
    let dir = tempfile::tempdir().unwrap();
    let mut rec = memleak()
        .args(["record", "-q", "-o"])
        .arg(dir.path().join("t.parquet"))
        .args(["--", "sleep", "100"])
        .spawn()
        .unwrap();
    let pid = running_command(&mut rec, "sleep");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(rec.id() as i32, libc::SIGKILL) };
    wait_within(&mut rec, 5, "memleak after SIGKILL");
    let status = wait_orphan(pid, 1);
    if status.is_none() {
        // SAFETY: the orphaned command, ours since memleak died.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        wait_orphan(pid, 5);
        panic!("the command outlived memleak by a second");
    }
    let status = status.unwrap();
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL,
        "wait status {status:#x}"
    );
}

/// Bad options are refused before anything is recorded or created, and
/// before the root check: an unprivileged user gets the same message.
#[test]
fn bad_record_options_are_refused_up_front() {
    if !common::can_record() {
        return;
    }
    let cases: &[(&[&str], &str)] = &[
        (
            &["--stack-depth", "0"],
            "invalid value '0' for '--stack-depth <N>': 0 is not in 1..=127",
        ),
        (&["--stack-depth", "128"], "128 is not in 1..=127"),
        (
            &["--ring-size", "1k"],
            "invalid value '1k' for '--ring-size <SIZE>': 1 KiB is not in 4 KiB to 1 GiB",
        ),
        (&["--ring-size", "2G"], "2 GiB is not in 4 KiB to 1 GiB"),
        (&["--poll-ms", "0"], "0 is not in 1..=1000"),
        (&["--poll-ms", "1001"], "1001 is not in 1..=1000"),
        (
            &["-z", "100", "-Z", "10"],
            "--min-size (100) is larger than --max-size (10)",
        ),
        (
            &["-z", "2k", "-Z", "1k"],
            "--min-size (2048) is larger than --max-size (1024)",
        ),
        (
            &["-z", "12q"],
            r#"invalid size "12q": unknown unit "q" (use k, M, G)"#,
        ),
        (&["-d", "0"], r#"invalid duration "0": must be more than 0"#),
        (&["-d", "10parsecs"], r#"unknown unit "parsecs""#),
        (&["--kill-after", "1s", "--detach"], "cannot be used with"),
    ];
    let no_command: &[(&[&str], &str)] = &[
        (
            &["-z", "2", "-Z", "1", "-p", "1"],
            "--min-size (2) is larger than --max-size (1)",
        ),
        (&["--detach", "-p", "1"], "--detach needs a command"),
        (
            &["--kill-after", "1s", "-p", "1"],
            "--kill-after needs a command",
        ),
    ];
    let setpriv = Path::new("/usr/bin/setpriv").exists();
    if !setpriv {
        eprintln!("note: no setpriv; checking as the current user only");
    }
    for (args, needle) in cases
        .iter()
        .map(|&(a, n)| (a, n, true))
        .chain(no_command.iter().map(|&(a, n)| (a, n, false)))
        .map(|(a, n, with_command)| {
            let mut v: Vec<&str> = a.to_vec();
            if with_command {
                v.extend(["--", "true"]);
            }
            (v, n)
        })
    {
        let dir = tempfile::tempdir().unwrap();
        let out_path = dir.path().join("t");
        let mut runs = vec![memleak()];
        if setpriv {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(env!("CARGO_BIN_EXE_memleak"));
            runs.push(c);
        }
        for mut cmd in runs {
            // -o before the command's `--`.
            let (opts, command) = match args.iter().position(|&a| a == "--") {
                Some(i) => args.split_at(i),
                None => (&args[..], &[][..]),
            };
            let out = cmd
                .arg("record")
                .args(opts)
                .arg("-o")
                .arg(&out_path)
                .args(command)
                .output()
                .unwrap();
            let line = one_line_error(&out);
            assert!(line.contains(needle), "{args:?}: {line}");
            assert!(!out_path.exists(), "{args:?}: the output was created");
        }
    }
}

/// A full stderr (`2>/dev/full`; a closed pipe is the same EPIPE-style
/// error) does not stop a recording: every message is written without
/// panicking, and the trace is finished. (A closed descriptor, `2>&-`,
/// Rust's stderr ignores by itself.)
#[test]
fn full_stderr_does_not_stop_a_recording() {
    if !common::can_record() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let script = format!(
        "exec {} record -v -o {} -- true 2>/dev/full",
        env!("CARGO_BIN_EXE_memleak"),
        trace.display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let t = memleak_trace::Trace::open(&trace).unwrap();
    assert!(t.meta().complete);
}
