//! Holding a process still for a scan: every thread stopped with ptrace,
//! its registers read, and every thread let go again on every path.
//!
//! Two ways in: [`Stopped::seize`] attaches to a running process
//! (`PTRACE_SEIZE` + `PTRACE_INTERRUPT` of each thread, detached by
//! [`Stopped::resume`] or on drop), and [`Stopped::traced`] uses a process
//! memleak already traces and holds (its command, stopped at exit), which
//! stays the caller's to continue.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::types::ScanError;
use crate::procmaps::gone;

/// One stopped thread.
#[derive(Clone)]
pub struct StoppedThread {
    /// Thread id.
    pub tid: u32,
    /// Its general registers; `None` if it could not be read (a thread
    /// on its way out).
    pub regs: Option<libc::user_regs_struct>,
    /// The signal it was stopping for, delivered again when it is let go.
    inject: i32,
}

/// Where a thread that exited left its stack: its stack pointer and its
/// thread pointer (`fs_base`) at its exit stop. Memcheck scans a stack
/// only from the stack pointer up; glibc keeps the stacks of exited
/// threads mapped (its stack cache), and below that pointer they hold
/// stale words memcheck never reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitedThread {
    /// The stack pointer at the thread's exit.
    pub sp: u64,
    /// Its thread pointer (glibc's TCB, inside the same mapping).
    pub fs_base: u64,
}

/// The exited threads of each traced process, by thread pointer (a
/// stack glibc reuses for a new thread keeps its thread pointer: the
/// latest exit wins).
static EXITED: std::sync::Mutex<
    Option<std::collections::HashMap<u32, std::collections::HashMap<u64, u64>>>,
> = std::sync::Mutex::new(None);

/// Notes where thread `tid` of process `tgid`, in its exit stop
/// (`PTRACE_EVENT_EXIT`), leaves its stack, for the scan at the
/// process's exit ([`Stopped::traced`]).
pub fn note_thread_exit(tgid: u32, tid: u32) {
    let Some(r) = get_regs(tid) else { return };
    let mut g = EXITED.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(Default::default)
        .entry(tgid)
        .or_default()
        .insert(r.fs_base, r.rsp);
}

/// The exited threads noted for `pid` (and forgets them).
fn take_exited(pid: u32) -> Vec<ExitedThread> {
    let mut g = EXITED.lock().unwrap_or_else(|e| e.into_inner());
    let mut v: Vec<ExitedThread> = g
        .as_mut()
        .and_then(|m| m.remove(&pid))
        .unwrap_or_default()
        .into_iter()
        .map(|(fs_base, sp)| ExitedThread { sp, fs_base })
        .collect();
    v.sort_unstable_by_key(|e| e.sp);
    v
}

/// A process held still: see the [module](self).
pub struct Stopped {
    /// Process id.
    pub pid: u32,
    /// Its threads.
    pub threads: Vec<StoppedThread>,
    /// Its threads that exited before (known for a traced command only).
    pub exited: Vec<ExitedThread>,
    /// When the process was stopped (CLOCK_MONOTONIC ns, the clock of
    /// the events).
    pub ts_ns: u64,
    since: Instant,
    /// Whether we attached, and so must detach.
    seized: bool,
    resumed: bool,
}

/// The threads of `pid`, by id.
pub(crate) fn threads_of(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// CLOCK_MONOTONIC in ns.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn get_regs(tid: u32) -> Option<libc::user_regs_struct> {
    // SAFETY: an all-zero user_regs_struct is valid; PTRACE_GETREGS fills it.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: the buffer is a user_regs_struct.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGS,
            tid as libc::pid_t,
            0,
            &mut regs as *mut libc::user_regs_struct,
        )
    };
    (r == 0).then_some(regs)
}

impl Stopped {
    /// Stops every thread of a running process we do not trace yet.
    /// Threads started meanwhile are stopped too (the task list is read
    /// again until it holds no thread we have not stopped).
    pub fn seize(pid: u32) -> Result<Stopped, ScanError> {
        if gone(pid) {
            return Err(ScanError::Gone(pid));
        }
        let mut s = Stopped {
            pid,
            threads: Vec::new(),
            exited: Vec::new(),
            ts_ns: 0,
            since: Instant::now(),
            seized: true,
            resumed: false,
        };
        let mut seen: HashSet<u32> = HashSet::new();
        loop {
            let new: Vec<u32> = threads_of(pid)
                .into_iter()
                .filter(|t| !seen.contains(t))
                .collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                seen.insert(tid);
                // SAFETY: plain ptrace requests on a thread id.
                let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid as libc::pid_t, 0, 0) };
                if r != 0 {
                    let os = std::io::Error::last_os_error();
                    let e = memleak_trace::describe_io(&os);
                    match os.raw_os_error() {
                        Some(libc::ESRCH) => continue, // it ended
                        Some(libc::EPERM) => {
                            return Err(ScanError::Permission(format!(
                                "cannot stop process {pid} with ptrace: {e} (it is traced by \
                                 another process, such as a debugger, or memleak lacks \
                                 CAP_SYS_PTRACE)"
                            )))
                        }
                        _ => return Err(ScanError::Os(format!("ptrace(SEIZE, {tid}): {e}"))),
                    }
                }
                // SAFETY: a thread we just seized.
                unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid as libc::pid_t, 0, 0) };
                let mut status = 0;
                let w = loop {
                    // SAFETY: waiting for our tracee.
                    let w = unsafe { libc::waitpid(tid as libc::pid_t, &mut status, libc::__WALL) };
                    if w < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
                    {
                        continue;
                    }
                    break w;
                };
                if w < 0 || !libc::WIFSTOPPED(status) {
                    continue; // it ended before it stopped
                }
                // The interrupt's stop, a group stop (both PTRACE_EVENT_STOP),
                // or a signal about to be delivered: handed back at detach.
                let inject = if status >> 16 == libc::PTRACE_EVENT_STOP {
                    0
                } else {
                    libc::WSTOPSIG(status)
                };
                s.threads.push(StoppedThread {
                    tid,
                    regs: get_regs(tid),
                    inject,
                });
            }
        }
        s.ts_ns = monotonic_ns();
        if s.threads.is_empty() || gone(pid) {
            return Err(ScanError::Gone(pid));
        }
        Ok(s)
    }

    /// A process memleak traces and holds stopped already (its command,
    /// at its exit stop): the registers of the threads in a ptrace stop.
    /// At exit the other threads are being killed; each is given a moment
    /// to reach its own exit stop, and one that does not is scanned
    /// without its registers (its stack mapping then counts as a whole).
    pub fn traced(pid: u32) -> Stopped {
        let deadline = Instant::now() + Duration::from_millis(20);
        let threads = threads_of(pid)
            .into_iter()
            .map(|tid| {
                let mut regs = get_regs(tid);
                while regs.is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_micros(200));
                    regs = get_regs(tid);
                }
                StoppedThread {
                    tid,
                    regs,
                    inject: 0,
                }
            })
            .collect();
        Stopped {
            pid,
            threads,
            exited: take_exited(pid),
            ts_ns: monotonic_ns(),
            since: Instant::now(),
            seized: false,
            resumed: false,
        }
    }

    /// How long the process has been held.
    pub fn held(&self) -> Duration {
        self.since.elapsed()
    }

    /// Lets the process run again (detaches what [`seize`](Self::seize)
    /// attached; nothing for [`traced`](Self::traced)); returns how long
    /// it was held.
    pub fn resume(mut self) -> Duration {
        self.detach();
        self.since.elapsed()
    }

    fn detach(&mut self) {
        if self.resumed {
            return;
        }
        self.resumed = true;
        if !self.seized {
            return;
        }
        for t in &self.threads {
            // SAFETY: a thread we seized; a thread that ended meanwhile
            // just fails with ESRCH.
            unsafe {
                libc::ptrace(
                    libc::PTRACE_DETACH,
                    t.tid as libc::pid_t,
                    0,
                    t.inject as libc::c_long,
                )
            };
        }
    }
}

impl Drop for Stopped {
    /// Never leaves a process stopped: an error or a panic between
    /// [`seize`](Stopped::seize) and [`resume`](Stopped::resume) detaches
    /// here.
    fn drop(&mut self) {
        self.detach();
    }
}
