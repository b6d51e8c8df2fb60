//! `record --follow-forks` of a command that runs more programs than the
//! traced sets hold at once (4,096 pids in the probe's map and in the
//! agent's list, 4,096 unwind tables), under a limit of open files that
//! the links of every process ever followed would pass: a shell loop, as
//! in a build or a test script. Each capture records every process, loses
//! nothing, and ends as the command does.
#![cfg(feature = "bpf")]

mod common;

use std::os::unix::process::CommandExt;

use common::fixtures::{memleak, recording_guard};

/// More processes than the traced sets have places.
const PROGRAMS: usize = 4200;
/// Open files for memleak: each followed process held five (a link per
/// allocator program and the `_dl_debug_state` stop), so a hundred
/// programs used to be the end of the recording.
const FILES: u64 = 512;

fn record_loop(capture: &str) {
    let _guard = recording_guard(false);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.parquet");
    let script = format!("i=0; while [ $i -lt {PROGRAMS} ]; do /bin/true; i=$((i+1)); done");
    let mut cmd = memleak();
    cmd.args(["record", "-q", "--follow-forks", "--capture", capture, "-o"])
        .arg(&trace)
        .args(["--", "sh", "-c", &script]);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between
    // fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: FILES,
                rlim_max: FILES,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{capture}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("warning"),
        "{capture}: a warning: {stderr}"
    );
    let meta = memleak_trace::Trace::open(&trace).unwrap().meta().clone();
    assert_eq!(meta.pids.len(), PROGRAMS + 1, "{capture}: every process");
    let lost = common::fixtures::lost_events(&meta);
    assert_eq!(lost, 0, "{capture}: {:?}", meta.counters.lost);
    let events = common::fixtures::event_counts(&trace);
    assert_eq!(events.get("fork"), Some(&(PROGRAMS as u64)), "{events:?}");
    assert_eq!(
        events.get("exec"),
        Some(&(PROGRAMS as u64 + 1)),
        "{events:?}"
    );
    assert_eq!(
        events.get("exit"),
        Some(&(PROGRAMS as u64 + 1)),
        "{events:?}"
    );
}

#[test]
fn four_thousand_programs_with_the_probes() {
    if !common::can_record() {
        return;
    }
    record_loop("bpf");
}

#[test]
fn four_thousand_programs_with_the_agent() {
    if !common::can_record() {
        return;
    }
    record_loop("preload");
}
