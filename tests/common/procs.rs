//! The processes of end-to-end tests: waiting for them without hanging,
//! finding memleak's command, and reaping what PID 1 does not reap here.

use std::time::{Duration, Instant};

/// Waits for a child, failing (not hanging) if it takes more than `secs`.
pub fn wait_within(
    child: &mut std::process::Child,
    secs: u64,
    what: &str,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{what} hung: still running after {secs} s");
}

/// A process's state letter in /proc (R, S, T, t, Z...), None once gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether a process has exited and been waited for by its parent.
pub fn reaped(pid: u32) -> bool {
    proc_state(pid).is_none()
}

/// The pid of memleak's child once it runs `comm` (after exec, so after
/// memleak set up its signal handlers).
pub fn running_command(rec: &mut std::process::Child, comm: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(status) = rec.try_wait().unwrap() {
            panic!("memleak ended before the command ran: {status:?}");
        }
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some((head, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let ppid = rest.split_whitespace().nth(1);
            if head.ends_with(&format!("({comm}")) && ppid == Some(&rec.id().to_string()) {
                return pid;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = rec.kill();
    let _ = rec.wait();
    panic!("memleak's command {comm} did not start");
}

/// Orphans of memleak's command come to this process, to be waited for:
/// PID 1 here does not reap them.
pub fn become_subreaper() {
    // SAFETY: prctl with plain integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER");
}

/// Waits up to `secs` for a process that became our child as an orphan;
/// its wait status, or None if it is still running.
pub fn wait_orphan(pid: u32, secs: u64) -> Option<libc::c_int> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let mut status = 0;
        // SAFETY: waiting for one given pid.
        let rc = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
        assert!(
            rc >= 0,
            "{pid} is not our child: {}",
            std::io::Error::last_os_error()
        );
        if rc > 0 {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The processes whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<u32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&p| {
                std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                        == Some(&pid.to_string())
                })
            })
            .collect();
        if !found.is_empty() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
