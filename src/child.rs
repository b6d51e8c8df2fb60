//! A child process started suspended, released once the probes are in
//! place, and traced with ptrace only to stop it at exit while its
//! address space can still be read.

use std::ffi::CString;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::exit_status::Exit;

/// A command memleak started: [`spawn`](Child::spawn)ed suspended,
/// [`release`](Child::release)d, then [`poll`](Child::poll)ed until it ends.
pub struct Child {
    pub pid: u32,
    go_tx: libc::c_int,
    err_rx: libc::c_int,
    /// How the command ended, once it is known.
    exit: Option<Exit>,
    exited: bool,
    detached: bool,
    /// Processes the command forked, traced with --follow-forks.
    adopted: std::collections::HashSet<u32>,
}

impl Drop for Child {
    /// A child we started for a recording that failed is not left
    /// running untraced: it is killed and reaped, and the processes
    /// it forked that we follow are killed.
    fn drop(&mut self) {
        if !self.exited && !self.detached {
            self.signal(libc::SIGKILL);
            // SAFETY: our own child.
            unsafe {
                let mut status = 0;
                libc::waitpid(self.pid as i32, &mut status, libc::__WALL);
            }
        }
    }
}

/// Whether a traced task is a process (thread-group leader).
fn is_process(tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Tgid:")
                    .map(|v| v.trim().parse::<u32>().ok())
            })
        })
        .flatten()
        == Some(tid)
}

/// The process of a thread (itself if it cannot be read).
fn tgid_of(tid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Tgid:")
                    .and_then(|v| v.trim().parse::<u32>().ok())
            })
        })
        .unwrap_or(tid)
}

/// Whether a SIGSTOP is queued for a thread (stable while it is in a
/// ptrace stop: only it dequeues its signals).
fn sigstop_pending(tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigPnd:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (libc::SIGSTOP - 1)) != 0)
}

/// The threads of a process.
fn threads(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

impl Child {
    /// Forks a child that waits for [`release`](Self::release) before
    /// exec. Everything the child needs is prepared before the fork, so
    /// it allocates nothing of its own (no phantom leaks from us).
    ///
    /// Unless `detach`, the child is killed if memleak dies (a `kill -9`
    /// must not leave it running untraced). The kernel sends that
    /// signal when the *thread* that forked exits: call this from the
    /// main thread, which lives until memleak ends. With `detach` the
    /// child gets a process group of its own instead, so that Ctrl-C in
    /// a terminal stops only the recording.
    pub fn spawn(argv: &[String], detach: bool) -> Result<Child> {
        let cargs: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_str()))
            .collect::<Result<_, _>>()
            .context("command contains a NUL byte")?;
        let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let mut go = [0; 2];
        let mut err = [0; 2];
        // SAFETY: pipe2 writes two fds into the arrays.
        unsafe {
            if libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) != 0
                || libc::pipe2(err.as_mut_ptr(), libc::O_CLOEXEC) != 0
            {
                bail!(
                    "pipe: {}",
                    crate::output::describe(&std::io::Error::last_os_error())
                );
            }
        }
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the child only calls async-signal-safe functions.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!(
                "fork: {}",
                crate::output::describe(&std::io::Error::last_os_error())
            );
        }
        if pid == 0 {
            // SAFETY: in the forked child, which must not allocate: only
            // async-signal-safe calls, on the fds and the argv pointers
            // (into `cargs`, still alive) prepared before the fork.
            unsafe {
                if detach {
                    libc::setpgid(0, 0);
                } else {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    // memleak may have died before the prctl.
                    if libc::getppid() != parent {
                        libc::_exit(126);
                    }
                }
                let mut b = [0u8; 1];
                libc::close(go[1]);
                libc::close(err[0]);
                libc::read(go[0], b.as_mut_ptr().cast(), 1);
                if b[0] != b'g' {
                    libc::_exit(126);
                }
                libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
                libc::execvp(ptrs[0], ptrs.as_ptr());
                let e = *libc::__errno_location();
                libc::write(err[1], (&e as *const i32).cast(), 4);
                libc::_exit(127);
            }
        }
        // SAFETY: closing our copies of the child's pipe ends.
        unsafe {
            libc::close(go[0]);
            libc::close(err[1]);
        }
        Ok(Child {
            pid: pid as u32,
            go_tx: go[1],
            err_rx: err[0],
            exit: None,
            exited: false,
            detached: false,
            adopted: Default::default(),
        })
    }

    /// Lets the child exec; fails if exec fails. `on_exec` runs at the
    /// stop right after the exec, before the program's first instruction
    /// (a statically linked program is mapped then); the child is killed
    /// if it fails.
    pub fn release(
        &mut self,
        follow_forks: bool,
        on_exec: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let mut e = 0i32;
        // SAFETY: fds are ours; buffers are valid.
        let n = unsafe {
            libc::write(self.go_tx, b"g".as_ptr().cast(), 1);
            libc::close(self.go_tx);
            let n = libc::read(self.err_rx, (&mut e as *mut i32).cast(), 4);
            libc::close(self.err_rx);
            n
        };
        if n == 4 {
            self.reap_blocking();
            bail!(
                "cannot execute command: {}",
                crate::output::describe(&std::io::Error::from_raw_os_error(e))
            );
        }
        // The exec stop (SIGTRAP) of PTRACE_TRACEME: ask for a stop at
        // exit too, then let it run.
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe {
            while libc::waitpid(self.pid as i32, &mut status, 0) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
            if libc::WIFSTOPPED(status) {
                on_exec()?;
                libc::ptrace(
                    libc::PTRACE_SETOPTIONS,
                    self.pid as i32,
                    0,
                    libc::PTRACE_O_TRACEEXIT
                        | libc::PTRACE_O_TRACECLONE
                        | libc::PTRACE_O_TRACEEXEC
                        | if follow_forks {
                            libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK
                        } else {
                            0
                        },
                );
                libc::ptrace(libc::PTRACE_CONT, self.pid as i32, 0, 0);
            } else if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                self.exited = true;
                self.exit = Some(Exit::from_wait_status(status));
            }
        }
        Ok(())
    }

    /// How the command ended (an exit code or a signal), once it did.
    pub fn exit(&self) -> Option<Exit> {
        self.exit
    }

    /// Whether processes the command forked (--follow-forks) still run.
    pub fn followed_running(&self) -> bool {
        !self.adopted.is_empty()
    }

    /// Whether the command is in memleak's process group, so that a
    /// signal from the terminal reached it as well as memleak.
    pub fn in_our_process_group(&self) -> bool {
        // SAFETY: plain syscalls.
        unsafe { libc::getpgid(self.pid as i32) == libc::getpgrp() }
    }

    /// Sends `sig` to the command, if it still runs, and to the
    /// processes it forked that we follow.
    pub fn signal(&self, sig: libc::c_int) {
        let pids = (!self.exited).then_some(self.pid);
        for pid in pids.into_iter().chain(self.adopted.iter().copied()) {
            // SAFETY: our traced processes; an exited one is a zombie
            // until we wait for it, so its pid is not reused.
            unsafe { libc::kill(pid as i32, sig) };
        }
    }

    /// Non-blocking: handles ptrace stops and exits; the command's exit
    /// status is then in [`exit`](Self::exit). `on_stop` runs
    /// while the command is stopped with its address space intact: at its
    /// exit, after each exec, and at the `_dl_debug_state` stops. `on_maps`
    /// gets the process of a thread stopped where its mappings may have
    /// changed (an exec, ld.so's `_dl_debug_state`), before it runs on.
    /// `on_exit` runs at the command's exit stop, after `on_stop`: the
    /// leak scan's moment (the other threads are being killed and stop
    /// at their own exit, or are gone).
    pub fn poll(
        &mut self,
        on_stop: &mut dyn FnMut() -> Result<()>,
        on_exit: &mut dyn FnMut() -> Result<()>,
        on_fork: &mut dyn FnMut(u32) -> Result<()>,
        on_maps: &mut dyn FnMut(u32) -> Result<()>,
    ) -> Result<()> {
        loop {
            let mut status = 0;
            // Every thread of the child is traced (PTRACE_O_TRACECLONE).
            // SAFETY: waiting for our own child's threads.
            let tid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if tid == 0 {
                return Ok(());
            }
            if tid < 0 {
                // Nothing left to wait for.
                self.exited = true;
                self.exit.get_or_insert(Exit::Code(0));
                self.adopted.clear();
                return Ok(());
            }
            let main = tid as u32 == self.pid;
            if (libc::WIFEXITED(status) || libc::WIFSIGNALED(status))
                && self.adopted.remove(&(tid as u32))
            {
                continue; // a followed child process ended
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                if main {
                    self.exited = true;
                    self.exit = Some(Exit::from_wait_status(status));
                }
                continue; // the command, or a thread, ended
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            let sig = libc::WSTOPSIG(status);
            let event = (status >> 16) & 0xff;
            let inject = match (sig, event) {
                // --follow-forks: a new process, stopped until we let it go.
                (libc::SIGTRAP, libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK) => {
                    let mut child: libc::c_ulong = 0;
                    // SAFETY: the thread is in a ptrace stop; child is writable.
                    unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0, &mut child) };
                    self.adopt(child as u32, on_fork)?;
                    0
                }
                // Exit of the process: its address space is still there.
                (libc::SIGTRAP, libc::PTRACE_EVENT_EXIT) => {
                    if main {
                        on_stop()?;
                        on_exit()?;
                    }
                    0
                }
                // A new program (`env LD_PRELOAD=... prog`): mapped, not
                // run yet.
                (libc::SIGTRAP, libc::PTRACE_EVENT_EXEC) => {
                    if main {
                        on_stop()?;
                    }
                    on_maps(tgid_of(tid as u32))?;
                    0
                }
                (libc::SIGTRAP, _) => 0,
                // Our probe on ld.so's _dl_debug_state (or a new
                // thread's first stop): the maps are about to change.
                (libc::SIGSTOP, _) => {
                    // A forked child's first stop can come before its
                    // parent's fork event.
                    if !main && is_process(tid as u32) {
                        self.adopt(tid as u32, on_fork)?;
                    }
                    on_stop()?;
                    on_maps(tgid_of(tid as u32))?;
                    0
                }
                (other, _) => other,
            };
            // SAFETY: the thread is in a ptrace stop.
            unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0, inject) };
        }
    }

    fn adopt(&mut self, pid: u32, on_fork: &mut dyn FnMut(u32) -> Result<()>) -> Result<()> {
        if self.adopted.insert(pid) {
            on_fork(pid)?;
        }
        Ok(())
    }

    /// Stops tracing and lets the command (and the processes it forked
    /// that we follow) run on, untraced and not stopped.
    ///
    /// A thread can only be detached in a ptrace stop, and with
    /// PTRACE_TRACEME there is no PTRACE_INTERRUPT: each thread is sent
    /// SIGSTOP and detached at that stop with the signal suppressed.
    /// The `_dl_debug_state` probe sends SIGSTOP too (the caller removes
    /// it first): one it sent just before ours is either still queued,
    /// and ours merges with it, or already dequeued, and its stop comes
    /// first, with ours queued; that stop is suppressed, and the thread
    /// detached at the next. A thread left untraced with a SIGSTOP
    /// queued would stop for real. Whatever does not stop within two
    /// seconds is detached by the kernel when memleak exits.
    pub fn detach(&mut self) {
        self.detached = true;
        if self.exited {
            return;
        }
        let mut pending: std::collections::HashSet<u32> = Default::default();
        for pid in std::iter::once(self.pid).chain(self.adopted.iter().copied()) {
            for tid in threads(pid) {
                // SAFETY: a thread of a process we trace.
                if unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGSTOP) } == 0 {
                    pending.insert(tid);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !pending.is_empty() && Instant::now() < deadline {
            let mut status = 0;
            // SAFETY: waiting for our traced threads.
            let tid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if tid < 0 {
                break;
            }
            if tid == 0 {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let tid = tid as u32;
            if !libc::WIFSTOPPED(status) {
                pending.remove(&tid); // it ended
                continue;
            }
            let sig = libc::WSTOPSIG(status);
            let event = (status >> 16) & 0xff;
            let (request, inject) = match (sig, event) {
                // A SIGSTOP stop, with ours still to come: the probe's,
                // dequeued before ours was sent. Suppressed.
                (libc::SIGSTOP, 0) if sigstop_pending(tid) => (libc::PTRACE_CONT, 0),
                // Ours, or one it merged with: nothing is left to stop
                // the thread once it is detached.
                (libc::SIGSTOP, 0) => {
                    pending.remove(&tid);
                    (libc::PTRACE_DETACH, 0)
                }
                // A new thread or process starts with a SIGSTOP of its own.
                (
                    libc::SIGTRAP,
                    libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK,
                ) => {
                    let mut new: libc::c_ulong = 0;
                    // SAFETY: the thread is in a ptrace stop; new is writable.
                    unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0, &mut new) };
                    pending.insert(new as u32);
                    (libc::PTRACE_CONT, 0)
                }
                // On its way out: it will not stop again.
                (libc::SIGTRAP, libc::PTRACE_EVENT_EXIT) => {
                    pending.remove(&tid);
                    (libc::PTRACE_CONT, 0)
                }
                (libc::SIGTRAP, _) => (libc::PTRACE_CONT, 0),
                // Someone else's signal: delivered; our SIGSTOP follows.
                (other, _) => (libc::PTRACE_CONT, other),
            };
            // SAFETY: the thread is in a ptrace stop.
            unsafe { libc::ptrace(request, tid, 0, inject) };
        }
    }

    /// Gives up on a command that does not die: it is neither killed
    /// again nor waited for when this is dropped.
    pub fn abandon(&mut self) {
        self.detached = true;
    }

    fn reap_blocking(&mut self) {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
        self.exited = true;
        self.exit = Some(Exit::from_wait_status(status));
    }
}
