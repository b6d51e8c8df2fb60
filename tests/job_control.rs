//! Job control of a command memleak records (issue 25): SIGSTOP and
//! SIGTSTP stop it as they would without memleak, every thread of it, and
//! SIGCONT lets it go on; memleak keeps recording meanwhile, and the
//! recording ends as usual, with a valid trace. Ctrl-Z (SIGTSTP to the
//! whole process group) stops memleak and the command, `fg` (SIGCONT to
//! the group) resumes both.
//!
//! The command is `fixtures/ticker`: threads that each write a tick count
//! to their own slot of a file every 20 ms. A stopped command is one
//! whose threads are all stopped in /proc (`T`, or `t` for a traced
//! thread: memleak holds a stopped command in a ptrace stop, as strace
//! and gdb do) and whose counts do not move.
#![cfg(feature = "bpf")]

mod common;

use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::fixtures::{fixtures_dir, memleak, recording_guard, RecordingGuard};

/// Ticks each thread makes: 3 s of running at 20 ms a tick.
const TICKS: u64 = 150;
/// How long a stopped command is watched for progress.
const HOLD: Duration = Duration::from_millis(600);
/// Generous deadlines for states to be reached (a loaded machine).
const DEADLINE: Duration = Duration::from_secs(30);

/// `memleak record -o TRACE ARGS -- COMMAND` running.
struct Recording {
    rec: Child,
    dir: tempfile::TempDir,
    _guard: RecordingGuard,
}

impl Drop for Recording {
    /// A failed test leaves nothing running: memleak is killed (and its
    /// command with it, PR_SET_PDEATHSIG) and waited for.
    fn drop(&mut self) {
        if self.rec.try_wait().ok().flatten().is_none() {
            let _ = self.rec.kill();
            let _ = self.rec.wait();
        }
    }
}

impl Recording {
    /// Starts a recording of `command`. memleak runs in a process group
    /// of its own, as a shell starts a job; it is not orphaned (this test
    /// is in its session), so the kernel carries out SIGTSTP, SIGTTIN and
    /// SIGTTOU in it, wherever the tests run.
    fn start(args: &[&str], command: &[&str]) -> Recording {
        let guard = recording_guard(false);
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = memleak();
        cmd.arg("record")
            .args(args)
            .arg("-o")
            .arg(dir.path().join("t.parquet"))
            .arg("--")
            .args(command)
            .stdout(Stdio::null())
            // A file, not a pipe: nothing blocks on a full pipe.
            .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        Recording {
            rec: cmd.spawn().unwrap(),
            dir,
            _guard: guard,
        }
    }

    /// Records `ticker COUNTS THREADS TICKS [dl]`.
    fn ticker(args: &[&str], threads: usize, dl: bool) -> (Recording, Ticker) {
        let dir = fixtures_dir();
        let counts = tempfile::NamedTempFile::new().unwrap().into_temp_path();
        let exe = dir.join("ticker");
        let (threads_s, ticks_s) = (threads.to_string(), TICKS.to_string());
        let mut command = vec![
            exe.to_str().unwrap(),
            counts.to_str().unwrap(),
            &threads_s,
            &ticks_s,
        ];
        if dl {
            command.push("dl");
        }
        let mut r = Recording::start(args, &command);
        let pid = r.child_running("ticker");
        (r, Ticker::new(pid, threads, counts))
    }

    fn trace(&self) -> PathBuf {
        self.dir.path().join("t.parquet")
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// The pid of memleak's child once it runs `comm` (it has exec'd).
    fn child_running(&mut self, comm: &str) -> u32 {
        let me = self.rec.id();
        let found = wait_for(DEADLINE, || {
            if let Some(status) = self.rec.try_wait().unwrap() {
                panic!(
                    "memleak ended before {comm} ran: {status:?}\n{}",
                    self.stderr()
                );
            }
            children(me).into_iter().find(|&p| self::comm(p) == comm)
        });
        found.unwrap_or_else(|| panic!("memleak's command {comm} did not start"))
    }

    /// Waits for memleak to end.
    fn wait(&mut self) -> ExitStatus {
        let status = wait_for(DEADLINE * 2, || self.rec.try_wait().unwrap());
        status.unwrap_or_else(|| panic!("memleak did not end:\n{}", self.stderr()))
    }

    /// Waits for memleak to end with status `code`, then checks its
    /// trace: complete, the command's exit status in it, readable by
    /// `memleak info`. Returns the trace.
    fn finish(&mut self, code: i32) -> memleak_trace::Trace {
        let status = self.wait();
        let stderr = self.stderr();
        assert_eq!(status.code(), Some(code), "{stderr}");
        let t =
            memleak_trace::Trace::open(self.trace()).unwrap_or_else(|e| panic!("{e}: {stderr}"));
        assert!(t.meta().complete, "trace not closed: {stderr}");
        assert!(t.warnings().is_empty(), "{:?}", t.warnings());
        assert_eq!(t.meta().exit_code, Some(code), "{stderr}");
        let info = memleak().arg("info").arg(self.trace()).output().unwrap();
        assert!(
            info.status.success(),
            "memleak info: {}",
            String::from_utf8_lossy(&info.stderr)
        );
        t
    }
}

/// A running `ticker`.
/// A shell command line that runs the ticker (`shape` puts the quoted
/// `ticker COUNTS THREADS TICKS` into it), and its counts file.
fn ticker_script(threads: usize, shape: impl Fn(&str) -> String) -> (String, tempfile::TempPath) {
    let counts = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let exe = fixtures_dir().join("ticker");
    let ticker = format!(
        "'{}' '{}' {threads} {TICKS}",
        exe.display(),
        counts.display()
    );
    (shape(&ticker), counts)
}

struct Ticker {
    pid: u32,
    threads: usize,
    counts: PathBuf,
    _file: tempfile::TempPath,
}

impl Ticker {
    fn new(pid: u32, threads: usize, counts: tempfile::TempPath) -> Ticker {
        Ticker {
            pid,
            threads,
            counts: counts.to_path_buf(),
            _file: counts,
        }
    }

    /// Each thread's tick count (0 until it wrote one).
    fn counts(&self) -> Vec<u64> {
        let b = std::fs::read(&self.counts).unwrap_or_default();
        (0..self.threads)
            .map(|i| {
                b.get(i * 8..i * 8 + 8)
                    .map_or(0, |s| u64::from_ne_bytes(s.try_into().unwrap()))
            })
            .collect()
    }

    /// Waits until every thread has ticked past `floor`'s count.
    fn wait_progress(&self, floor: &[u64], what: &str) {
        let moved = wait_for(DEADLINE, || {
            let now = self.counts();
            now.iter().zip(floor).all(|(n, f)| n > f).then_some(())
        });
        assert!(
            moved.is_some(),
            "{what}: the threads did not tick: {:?} (from {floor:?}), states {:?}",
            self.counts(),
            thread_states(self.pid)
        );
    }

    /// Waits until every thread is stopped, then watches it for a while:
    /// it must stay stopped and tick no more.
    fn assert_stays_stopped(&self, what: &str) {
        let stopped = wait_for(DEADLINE, || {
            let s = thread_states(self.pid);
            (s.len() == self.threads && s.iter().all(|&c| is_stopped(c))).then_some(())
        });
        assert!(
            stopped.is_some(),
            "{what}: the command is not stopped: states {:?}",
            thread_states(self.pid)
        );
        let before = self.counts();
        // Not stopped because it is done: every thread still has work.
        assert!(
            before.iter().all(|&n| n < TICKS),
            "{what}: the command ran to its end instead: {before:?}"
        );
        let since = Instant::now();
        while since.elapsed() < HOLD {
            std::thread::sleep(Duration::from_millis(50));
            let s = thread_states(self.pid);
            assert!(
                s.len() == self.threads && s.iter().all(|&c| is_stopped(c)),
                "{what}: the command did not stay stopped: states {s:?}"
            );
        }
        assert_eq!(
            self.counts(),
            before,
            "{what}: a stopped command made progress"
        );
    }

    /// Mallocs the ticker made, in a trace.
    fn mallocs(&self, t: &memleak_trace::Trace) -> u64 {
        let mut n = 0;
        for b in t.events(memleak_trace::EventColumns::ALL).unwrap() {
            let b = b.unwrap();
            n += (0..b.len())
                .map(|i| b.event(i))
                .filter(|e| e.pid == self.pid && e.kind == memleak_trace::EventKind::Malloc)
                .count() as u64;
        }
        n
    }
}

/// Calls `f` every 10 ms until it returns something or `limit` passes.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The state letter of a stat line (R, S, T, t, Z...).
fn state_of(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

fn proc_state(pid: u32) -> Option<char> {
    state_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The states of a process's threads; a zombie process has none.
fn thread_states(pid: u32) -> Vec<char> {
    if proc_state(pid) == Some('Z') {
        return Vec::new();
    }
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            state_of(&stat)
        })
        .collect()
}

/// Stopped by a signal (`T`), or, traced, held in a ptrace stop (`t`).
fn is_stopped(state: char) -> bool {
    matches!(state, 'T' | 't')
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The children of a process (forked by any of its threads).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn kill(pid: i32, sig: libc::c_int) {
    // SAFETY: a signal to a process (group) this test started.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// `kill -SIG` of the command, then `kill -CONT`, for each of `sigs`: it
/// stops, makes no progress, runs again; it exits 0 and everything it did
/// is recorded.
fn stop_and_continue(sigs: &[libc::c_int], threads: usize, dl: bool) {
    if !common::can_record() {
        return;
    }
    let (mut rec, ticker) = Recording::ticker(&["-q"], threads, dl);
    let mut floor = vec![2; threads];
    for &sig in sigs {
        ticker.wait_progress(&floor, "before the stop");
        kill(ticker.pid as i32, sig);
        ticker.assert_stays_stopped(&format!("after signal {sig}"));
        floor = ticker.counts();
        kill(ticker.pid as i32, libc::SIGCONT);
    }
    ticker.wait_progress(&floor, "after SIGCONT");
    let t = rec.finish(0);
    assert_eq!(ticker.counts(), vec![TICKS; threads]);
    let mallocs = ticker.mallocs(&t);
    assert!(
        mallocs >= threads as u64 * TICKS,
        "{mallocs} mallocs recorded, the ticks alone made {}",
        threads as u64 * TICKS
    );
}

#[test]
fn sigstop_and_sigcont_single_threaded() {
    stop_and_continue(&[libc::SIGSTOP], 1, false);
}

#[test]
fn sigstop_and_sigcont_multi_threaded() {
    stop_and_continue(&[libc::SIGSTOP], 4, false);
}

#[test]
fn sigtstp_and_sigcont_single_threaded() {
    stop_and_continue(&[libc::SIGTSTP], 1, false);
}

#[test]
fn sigtstp_and_sigcont_multi_threaded() {
    stop_and_continue(&[libc::SIGTSTP], 4, false);
}

/// The other two stop signals, one after the other in one run.
#[test]
fn sigttin_and_sigttou_and_sigcont() {
    stop_and_continue(&[libc::SIGTTIN, libc::SIGTTOU], 2, false);
}

/// The `_dl_debug_state` probe stops the threads with SIGSTOPs of its
/// own, at every dlopen and dlclose: a user's SIGSTOP is not mistaken for
/// one of them, and theirs do not resume a stopped command.
#[test]
fn sigstop_of_a_command_stopping_in_ld_so() {
    stop_and_continue(&[libc::SIGSTOP], 3, true);
}

/// Ctrl-Z: the terminal sends SIGTSTP to the foreground process group,
/// memleak and its command. Both stop, so the shell gets its prompt back;
/// `fg` sends SIGCONT to the group, both go on and the recording
/// completes.
#[test]
fn ctrl_z_stops_memleak_and_the_command_fg_resumes_both() {
    if !common::can_record() {
        return;
    }
    let threads = 3;
    let (mut rec, ticker) = Recording::ticker(&[], threads, false);
    let group = rec.rec.id() as i32;
    ticker.wait_progress(&vec![2; threads], "before Ctrl-Z");
    kill(-group, libc::SIGTSTP);
    let memleak_stopped = wait_for(DEADLINE, || {
        (proc_state(group as u32) == Some('T')).then_some(())
    });
    assert!(
        memleak_stopped.is_some(),
        "memleak is not stopped: {:?}",
        proc_state(group as u32)
    );
    ticker.assert_stays_stopped("after Ctrl-Z");
    assert_eq!(
        proc_state(group as u32),
        Some('T'),
        "memleak did not stay stopped"
    );
    let at_stop = ticker.counts();
    kill(-group, libc::SIGCONT);
    ticker.wait_progress(&at_stop, "after fg");
    let t = rec.finish(0);
    assert_eq!(ticker.counts(), vec![TICKS; threads]);
    assert!(ticker.mallocs(&t) >= threads as u64 * TICKS);
    let stderr = rec.stderr();
    assert!(stderr.contains("memleak: recorded "), "{stderr}");
}

/// Ctrl-Z on a command that ignores SIGTSTP: without memleak nothing
/// would stop; with it, nothing stops either (memleak does not stop
/// before its command).
#[test]
fn ctrl_z_on_a_command_that_ignores_it_stops_nothing() {
    if !common::can_record() {
        return;
    }
    let threads = 2;
    // An ignored signal stays ignored across exec.
    let (script, counts) = ticker_script(threads, |ticker| format!("trap '' TSTP; exec {ticker}"));
    let mut rec = Recording::start(&["-q"], &["sh", "-c", &script]);
    let group = rec.rec.id() as i32;
    let pid = rec.child_running("ticker");
    let ticker = Ticker::new(pid, threads, counts);
    ticker.wait_progress(&vec![2; threads], "before Ctrl-Z");
    let before = ticker.counts();
    kill(-group, libc::SIGTSTP);
    // Watched for twice as long as memleak waits for its command.
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
        assert_ne!(proc_state(group as u32), Some('T'), "memleak stopped");
    }
    assert_ne!(ticker.counts(), before, "the command stopped");
    rec.finish(0);
    assert_eq!(ticker.counts(), vec![TICKS; threads]);
}

/// `kill -TSTP` of memleak alone: it passes the signal on, stops once the
/// command has, and `kill -CONT` of memleak resumes both.
#[test]
fn sigtstp_to_memleak_is_passed_on_and_so_is_sigcont() {
    if !common::can_record() {
        return;
    }
    let threads = 2;
    let (mut rec, ticker) = Recording::ticker(&["-q"], threads, false);
    let me = rec.rec.id();
    ticker.wait_progress(&vec![2; threads], "before the stop");
    kill(me as i32, libc::SIGTSTP);
    let memleak_stopped = wait_for(DEADLINE, || (proc_state(me) == Some('T')).then_some(()));
    assert!(
        memleak_stopped.is_some(),
        "memleak is not stopped: {:?}",
        proc_state(me)
    );
    ticker.assert_stays_stopped("after SIGTSTP to memleak");
    let at_stop = ticker.counts();
    kill(me as i32, libc::SIGCONT);
    ticker.wait_progress(&at_stop, "after SIGCONT to memleak");
    rec.finish(0);
    assert_eq!(ticker.counts(), vec![TICKS; threads]);
}

/// SIGKILL ends a stopped command, and with it the recording: memleak
/// exits with the command's status (137), the trace is complete.
#[test]
fn sigkill_of_a_stopped_command_ends_the_recording() {
    if !common::can_record() {
        return;
    }
    let threads = 3;
    let (mut rec, ticker) = Recording::ticker(&["-q"], threads, false);
    ticker.wait_progress(&vec![2; threads], "before the stop");
    kill(ticker.pid as i32, libc::SIGSTOP);
    ticker.assert_stays_stopped("after SIGSTOP");
    kill(ticker.pid as i32, libc::SIGKILL);
    rec.finish(128 + libc::SIGKILL);
    assert_eq!(proc_state(ticker.pid), None, "the command was not reaped");
}

/// --duration on a stopped command: like timeout(1), memleak follows its
/// SIGTERM with SIGCONT, so the command gets the SIGTERM (exit 143)
/// instead of waiting, stopped, for --kill-after's SIGKILL.
#[test]
fn duration_ends_a_stopped_command_with_sigterm() {
    if !common::can_record() {
        return;
    }
    let threads = 2;
    let (mut rec, ticker) = Recording::ticker(&["-d", "4s", "--kill-after", "10m"], threads, false);
    ticker.wait_progress(&vec![2; threads], "before the stop");
    kill(ticker.pid as i32, libc::SIGSTOP);
    ticker.assert_stays_stopped("after SIGSTOP");
    rec.finish(128 + libc::SIGTERM);
    let stderr = rec.stderr();
    assert!(stderr.contains("sent SIGTERM to the command"), "{stderr}");
}

/// --follow-forks: a process the command forked stops and continues the
/// same way (the followed processes share the command's ptrace loop).
#[test]
fn followed_child_stops_and_continues() {
    if !common::can_record() {
        return;
    }
    let threads = 2;
    let (script, counts) = ticker_script(threads, |ticker| format!("{ticker} & wait $!"));
    let mut rec = Recording::start(&["-q", "--follow-forks"], &["sh", "-c", &script]);
    let sh = rec.child_running("sh");
    let pid = wait_for(DEADLINE, || {
        children(sh).into_iter().find(|&p| comm(p) == "ticker")
    })
    .expect("the shell did not start ticker");
    let ticker = Ticker::new(pid, threads, counts);
    ticker.wait_progress(&vec![2; threads], "before the stop");
    kill(pid as i32, libc::SIGSTOP);
    ticker.assert_stays_stopped("after SIGSTOP");
    let at_stop = ticker.counts();
    kill(pid as i32, libc::SIGCONT);
    ticker.wait_progress(&at_stop, "after SIGCONT");
    let t = rec.finish(0);
    assert_eq!(ticker.counts(), vec![TICKS; threads]);
    assert!(ticker.mallocs(&t) >= threads as u64 * TICKS);
}

/// --detach of a stopped command: it is left stopped, untraced (`T`), as
/// a user who stopped it expects, and SIGCONT resumes it.
#[test]
fn detach_leaves_a_stopped_command_stopped() {
    if !common::can_record() {
        return;
    }
    // The command outlives memleak: it comes to this process to be
    // waited for (PID 1 here does not reap).
    // SAFETY: prctl with plain integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER");
    let threads = 2;
    let (mut rec, ticker) = Recording::ticker(&["-q", "--detach", "-d", "3s"], threads, false);
    ticker.wait_progress(&vec![2; threads], "before the stop");
    kill(ticker.pid as i32, libc::SIGSTOP);
    ticker.assert_stays_stopped("after SIGSTOP");
    let status = rec.wait();
    assert!(status.success(), "{}", rec.stderr());
    let tracer = std::fs::read_to_string(format!("/proc/{}/status", ticker.pid))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:").map(|v| v.trim().to_string()));
    assert_eq!(tracer.as_deref(), Some("0"), "the command is still traced");
    assert_eq!(
        thread_states(ticker.pid),
        vec!['T'; threads],
        "the command must be stopped, untraced"
    );
    ticker.assert_stays_stopped("after --detach");
    let at_stop = ticker.counts();
    kill(ticker.pid as i32, libc::SIGCONT);
    ticker.wait_progress(&at_stop, "after SIGCONT");
    let mut wstatus = 0;
    let exited = wait_for(DEADLINE, || {
        // SAFETY: waiting for one given pid, ours as an orphan.
        let rc = unsafe { libc::waitpid(ticker.pid as i32, &mut wstatus, libc::WNOHANG) };
        assert!(rc >= 0, "{}", std::io::Error::last_os_error());
        (rc > 0).then_some(())
    });
    if exited.is_none() {
        kill(ticker.pid as i32, libc::SIGKILL);
        panic!("the detached command did not finish");
    }
    assert!(
        libc::WIFEXITED(wstatus) && libc::WEXITSTATUS(wstatus) == 0,
        "wait status {wstatus:#x}"
    );
    assert_eq!(ticker.counts(), vec![TICKS; threads]);
}
