//! A child process started suspended, released once the probes are in
//! place, and traced with ptrace to hold it where its address space must
//! be read (exec, exit, forks, ld.so's `_dl_debug_state`). Job control
//! goes through untouched: a stop signal stops it as it would without
//! memleak, SIGCONT resumes it.

use std::ffi::CString;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::exit_status::Exit;

/// A command memleak started: [`spawn`](Child::spawn)ed suspended,
/// [`release`](Child::release)d, then [`poll`](Child::poll)ed until it ends.
pub struct Child {
    pub pid: u32,
    /// Whether the command runs with private copies of its libraries.
    pub private_libs: PrivateLibs,
    /// argv[0], as given: errors name it.
    program: String,
    go_tx: libc::c_int,
    err_rx: libc::c_int,
    /// How the command ended, once it is known.
    exit: Option<Exit>,
    exited: bool,
    detached: bool,
    /// Processes the command forked, traced with --follow-forks.
    adopted: std::collections::HashSet<u32>,
    /// Followed processes that ended since [`Child::take_ended`].
    ended: Vec<u32>,
    /// Threads in a group-stop (SIGSTOP, SIGTSTP...), left there with
    /// PTRACE_LISTEN until SIGCONT or SIGKILL.
    listening: std::collections::HashSet<u32>,
}

/// What became of the private library copies ([`super::private_libs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrivateLibs {
    /// Not asked for (`--shared-libraries`, or not root).
    Off,
    /// The command runs with its own copies.
    Done,
    /// Asked for, but a step failed (why): the system's files are used.
    Failed(String),
}

impl Drop for Child {
    /// A child we started for a recording that failed is not left
    /// running untraced: it is killed and reaped, and the processes
    /// it forked that we follow are killed.
    fn drop(&mut self) {
        if !self.exited && !self.detached {
            self.signal(libc::SIGKILL);
            // SIGKILL does not end a ptrace stop at exit (PTRACE_EVENT_EXIT),
            // and each thread gets there when it wakes to die, after the
            // kill: a command whose threads we let go of too early stayed
            // there, and memleak waited for it for ever. Let go of every
            // thread until the process is reaped.
            loop {
                let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid));
                for tid in tasks
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
                {
                    // SAFETY: detaching a thread we may trace; ESRCH
                    // while it is not stopped or not ours.
                    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
                }
                let mut status = 0;
                // SAFETY: our own child.
                let r = unsafe {
                    libc::waitpid(self.pid as i32, &mut status, libc::__WALL | libc::WNOHANG)
                };
                // Reaped, or not ours to wait for; a stop is let go of
                // above.
                if r < 0 || (r > 0 && !libc::WIFSTOPPED(status)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
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

/// Whether a signal is one of the four that stop a process.
fn is_stop_signal(sig: libc::c_int) -> bool {
    matches!(
        sig,
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
    )
}

/// Whether the SIGSTOP a thread is in a signal-delivery stop for is one
/// memleak asked for: sent by our `_dl_debug_state` probe
/// (`bpf_send_signal_thread`: si_code SI_KERNEL) or by the agent to itself
/// (SI_QUEUE with the agent's value, `MLA_STOP_VALUE` in agent/agent.h),
/// not a user's `kill` or `tgkill` (SI_USER, SI_TKILL). A thread that
/// cannot be asked is dying: its stop is as good as ours.
fn probe_sigstop(tid: u32) -> bool {
    // siginfo_t as bytes: si_code at 8; for SI_QUEUE the sender's pid at
    // 16 and the value at 24.
    let mut info = [0u8; 128];
    // SAFETY: the thread is in a ptrace stop; info is 128 writable bytes,
    // the size of a siginfo_t.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_GETSIGINFO,
            tid as libc::pid_t,
            0,
            info.as_mut_ptr(),
        )
    };
    let int_at = |o: usize| i32::from_ne_bytes(info[o..o + 4].try_into().unwrap_or_default());
    rc != 0
        || int_at(8) == libc::SI_KERNEL
        || (int_at(8) == libc::SI_QUEUE
            && int_at(24) == AGENT_STOP_VALUE
            && int_at(16) as u32 == tgid_of(tid))
}

/// `MLA_STOP_VALUE`.
const AGENT_STOP_VALUE: i32 = 0x4d4c_5354;

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

/// The threads of a process that have not exited (a main thread that
/// exited before the others stays listed, a zombie).
fn live_threads(pid: u32) -> Vec<u32> {
    threads(pid)
        .into_iter()
        .filter(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                .ok()
                .and_then(|s| {
                    let state = s.rsplit_once(')')?.1.trim_start().chars().next()?;
                    Some(!matches!(state, 'Z' | 'X'))
                })
                .unwrap_or(false)
        })
        .collect()
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
    ///
    /// With a `private` plan, the child gets its own copies of those
    /// libraries before anything is probed ([`super::private_libs`]);
    /// [`Child::private_libs`] says whether that worked.
    pub fn spawn(
        argv: &[String],
        detach: bool,
        mut private: Option<&mut super::private_libs::Plan>,
        env: &[(String, String)],
    ) -> Result<Child> {
        // The environment, with `env` set in it (built before the fork:
        // the child must not allocate).
        let envp: Option<Vec<CString>> = (!env.is_empty()).then(|| {
            use std::os::unix::ffi::OsStrExt;
            std::env::vars_os()
                .filter(|(k, _)| !env.iter().any(|(name, _)| k.as_bytes() == name.as_bytes()))
                .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
                .chain(env.iter().map(|(k, v)| format!("{k}={v}").into_bytes()))
                .filter_map(|b| CString::new(b).ok())
                .collect()
        });
        let mut envp_ptrs: Vec<*const libc::c_char> =
            envp.iter().flatten().map(|c| c.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        let cargs: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_str()))
            .collect::<Result<_, _>>()
            .context("command contains a NUL byte")?;
        let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let mut go = [0; 2];
        let mut err = [0; 2];
        let mut ready = [0; 2];
        // SAFETY: pipe2 writes two fds into the arrays.
        unsafe {
            if libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) != 0
                || libc::pipe2(err.as_mut_ptr(), libc::O_CLOEXEC) != 0
                || libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) != 0
            {
                bail!("pipe: {}", std::io::Error::last_os_error());
            }
        }
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the child only calls async-signal-safe functions.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
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
                // Before the parent attaches anything: its probes must
                // go on the private copies.
                let code = match private.as_deref_mut() {
                    Some(plan) => plan.apply_in_child(),
                    None => 0,
                };
                libc::close(ready[0]);
                libc::write(ready[1], (&code as *const i32).cast(), 4);
                libc::close(ready[1]);
                let mut b = [0u8; 1];
                libc::close(go[1]);
                libc::close(err[0]);
                libc::read(go[0], b.as_mut_ptr().cast(), 1);
                if b[0] != b'g' {
                    libc::_exit(126);
                }
                if envp.is_some() {
                    libc::execvpe(ptrs[0], ptrs.as_ptr(), envp_ptrs.as_ptr());
                } else {
                    libc::execvp(ptrs[0], ptrs.as_ptr());
                }
                let e = *libc::__errno_location();
                libc::write(err[1], (&e as *const i32).cast(), 4);
                libc::_exit(127);
            }
        }
        // SAFETY: closing our copies of the child's pipe ends, reading
        // the child's one report into a local.
        let private_libs = unsafe {
            libc::close(go[0]);
            libc::close(err[1]);
            libc::close(ready[1]);
            let mut code = 0i32;
            let n = loop {
                let n = libc::read(ready[0], (&mut code as *mut i32).cast(), 4);
                if n >= 0 || *libc::__errno_location() != libc::EINTR {
                    break n;
                }
            };
            libc::close(ready[0]);
            match (private.is_some(), n == 4, code) {
                (false, _, _) => PrivateLibs::Off,
                (true, true, 0) => PrivateLibs::Done,
                (true, true, c) => PrivateLibs::Failed(super::private_libs::describe_failure(c)),
                (true, false, _) => PrivateLibs::Failed("the command ended early".into()),
            }
        };
        Ok(Child {
            private_libs,
            program: argv[0].clone(),
            pid: pid as u32,
            go_tx: go[1],
            err_rx: err[0],
            exit: None,
            exited: false,
            detached: false,
            adopted: Default::default(),
            ended: Vec::new(),
            listening: Default::default(),
        })
    }

    /// Lets the child exec; fails if exec fails. `on_exec` runs at the
    /// stop right after the exec, before the program's first instruction
    /// (a statically linked program is mapped then); the child is killed
    /// if it fails.
    ///
    /// The child is attached with PTRACE_SEIZE, not PTRACE_TRACEME: only
    /// a seized tracee can be left in a group-stop (PTRACE_LISTEN), which
    /// job control needs (see [`poll`](Self::poll)). Until the exec only
    /// the exec stop is asked for, so that a failed exec ends the child
    /// with a plain exit.
    pub fn release(
        &mut self,
        follow_forks: bool,
        on_exec: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let pid = self.pid as libc::pid_t;
        // SAFETY: our own child, blocked on the pipe until we write "g".
        let seized = unsafe {
            libc::ptrace(
                libc::PTRACE_SEIZE,
                pid,
                0,
                libc::PTRACE_O_TRACEEXEC as libc::c_long,
            )
        } == 0;
        let seize_error = (!seized).then(std::io::Error::last_os_error);
        // SAFETY: the fd is ours. Without the "g" (not traced: it must not
        // run untraced) the child exits without exec.
        unsafe {
            if seized {
                libc::write(self.go_tx, b"g".as_ptr().cast(), 1);
            }
            libc::close(self.go_tx);
        }
        // The exec stop, or the end of a child that did not exec.
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child.
            if unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                self.exited = true;
                bail!("waiting for the command: {e}");
            }
            let event = (status >> 16) & 0xff;
            if !libc::WIFSTOPPED(status) || event == libc::PTRACE_EVENT_EXEC {
                break;
            }
            // A signal before the exec is delivered; any other stop (a
            // group-stop) ends at once: the exec comes first.
            let inject = if event == 0 {
                libc::WSTOPSIG(status)
            } else {
                0
            };
            // SAFETY: the child is in a ptrace stop.
            unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, inject as libc::c_long) };
        }
        if !libc::WIFSTOPPED(status) {
            self.exited = true;
            self.exit = Some(Exit::from_wait_status(status));
            let mut e = 0i32;
            // SAFETY: the fd is ours; e is writable. The child is gone, so
            // this does not block.
            let n = unsafe {
                let n = libc::read(self.err_rx, (&mut e as *mut i32).cast(), 4);
                libc::close(self.err_rx);
                n
            };
            if let Some(err) = seize_error {
                bail!("cannot trace the command: ptrace(PTRACE_SEIZE): {err}");
            }
            if n == 4 {
                bail!(
                    "cannot execute {}: {}",
                    self.program,
                    crate::output::describe(&std::io::Error::from_raw_os_error(e))
                );
            }
            return Ok(());
        }
        // SAFETY: our fd; the exec closed the child's end.
        unsafe { libc::close(self.err_rx) };
        on_exec()?;
        // Stops at exit, at new threads and processes and at later execs
        // from now on; then let it run.
        let options = libc::PTRACE_O_TRACEEXIT
            | libc::PTRACE_O_TRACECLONE
            | libc::PTRACE_O_TRACEEXEC
            | if follow_forks {
                libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK
            } else {
                0
            };
        // SAFETY: the child is in its exec stop.
        unsafe {
            libc::ptrace(libc::PTRACE_SETOPTIONS, pid, 0, options as libc::c_long);
            libc::ptrace(libc::PTRACE_CONT, pid, 0, 0);
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
    /// status is then in [`exit`](Self::exit). `on_stop` gets the process
    /// (the command, or one it forked that we follow) stopped with its
    /// address space intact: at the command's exit, after each exec, and
    /// at the `_dl_debug_state` stops. `on_maps`
    /// gets the process of a thread stopped where its mappings may have
    /// changed (an exec, ld.so's `_dl_debug_state`), before it runs on.
    /// `on_exit` runs at the command's exit stop, after `on_stop`: the
    /// leak scan's moment (the other threads are being killed and stop
    /// at their own exit, or are gone).
    ///
    /// Job control is the kernel's, as without memleak (ptrace(2),
    /// "Group-stop"): a stop signal (SIGSTOP but the probe's, SIGTSTP,
    /// SIGTTIN, SIGTTOU) is delivered, the kernel stops every thread, and
    /// each thread's group-stop (PTRACE_EVENT_STOP with the signal) is
    /// left in place with PTRACE_LISTEN; SIGCONT wakes it (another
    /// PTRACE_EVENT_STOP, with SIGTRAP), and it is let go.
    pub fn poll(
        &mut self,
        on_stop: &mut dyn FnMut(u32) -> Result<()>,
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
                self.listening.clear();
                return Ok(());
            }
            let main = tid as u32 == self.pid;
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                self.listening.remove(&(tid as u32));
                if self.adopted.remove(&(tid as u32)) {
                    self.ended.push(tid as u32);
                    continue; // a followed child process ended
                }
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
            let mut request = libc::PTRACE_CONT;
            let inject = match event {
                // --follow-forks: a new process, stopped until we let it go.
                libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                    let mut child: libc::c_ulong = 0;
                    // SAFETY: the thread is in a ptrace stop; child is writable.
                    unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0, &mut child) };
                    self.adopt(child as u32, on_fork)?;
                    0
                }
                // Exit of the process: its address space is still there.
                libc::PTRACE_EVENT_EXIT => {
                    if main {
                        on_stop(self.pid)?;
                        on_exit()?;
                    } else {
                        // Where its stack ends, for the scan at exit.
                        memleak_recorder::scan::note_thread_exit(tgid_of(tid as u32), tid as u32);
                    }
                    0
                }
                // A new program (`env LD_PRELOAD=... prog`): mapped, not
                // run yet. In a followed process too: a static or musl
                // program, whose allocator nothing probed yet.
                libc::PTRACE_EVENT_EXEC => {
                    on_stop(tgid_of(tid as u32))?;
                    on_maps(tgid_of(tid as u32))?;
                    0
                }
                // A group-stop: the thread stays stopped, as it would
                // untraced, until SIGCONT (or SIGKILL).
                libc::PTRACE_EVENT_STOP if is_stop_signal(sig) => {
                    self.listening.insert(tid as u32);
                    request = libc::PTRACE_LISTEN;
                    0
                }
                // SIGCONT woke a stopped thread: it runs on.
                libc::PTRACE_EVENT_STOP if self.listening.remove(&(tid as u32)) => 0,
                // A new thread's or process's first stop (or SIGCONT's
                // notice to a thread that was not stopped): the maps are
                // about to change.
                libc::PTRACE_EVENT_STOP => {
                    // A forked child's first stop can come before its
                    // parent's fork event.
                    if !main && is_process(tid as u32) {
                        self.adopt(tid as u32, on_fork)?;
                    }
                    on_stop(tgid_of(tid as u32))?;
                    on_maps(tgid_of(tid as u32))?;
                    0
                }
                // Signal-delivery stops. Our probe on ld.so's
                // _dl_debug_state: the maps are about to change.
                0 if sig == libc::SIGSTOP && probe_sigstop(tid as u32) => {
                    on_stop(tgid_of(tid as u32))?;
                    on_maps(tgid_of(tid as u32))?;
                    0
                }
                0 if sig == libc::SIGTRAP => 0,
                // Any other signal is delivered: a stop signal makes the
                // kernel stop the whole process (a group-stop, above).
                0 => sig,
                // PTRACE_EVENT_CLONE, PTRACE_EVENT_VFORK_DONE.
                _ => 0,
            };
            // SAFETY: the thread is in a ptrace stop.
            unsafe { libc::ptrace(request, tid, 0, inject) };
        }
    }

    /// Whether the command, or a process it forked that we follow, is
    /// stopped by a stop signal (a thread of it is in a group-stop).
    pub fn stopped(&self) -> bool {
        !self.listening.is_empty()
    }

    /// Whether every thread of the command and of the processes it forked
    /// that we follow is in a group-stop: nothing of the job runs.
    pub fn all_stopped(&self) -> bool {
        let pids = (!self.exited).then_some(self.pid);
        pids.into_iter()
            .chain(self.adopted.iter().copied())
            .flat_map(live_threads)
            .all(|tid| self.listening.contains(&tid))
    }

    /// The followed processes that ended since the last call: reaped by
    /// us, their pids are no one else's yet (the real parent hears of a
    /// traced child's death after its tracer).
    pub fn take_ended(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.ended)
    }

    fn adopt(&mut self, pid: u32, on_fork: &mut dyn FnMut(u32) -> Result<()>) -> Result<()> {
        if self.adopted.insert(pid) {
            on_fork(pid)?;
        }
        Ok(())
    }

    /// Stops tracing and lets the command (and the processes it forked
    /// that we follow) run on, untraced; a stopped one (SIGSTOP, SIGTSTP)
    /// stays stopped, as it would untraced, until SIGCONT.
    ///
    /// A thread can only be detached in a ptrace stop: each is sent
    /// PTRACE_INTERRUPT and detached at its next stop, whatever its kind,
    /// with the signal of a signal-delivery stop passed on (the kernel
    /// turns a group-stop into a plain stop). The `_dl_debug_state` probe
    /// sends SIGSTOP (the caller removes it first): a thread with one of
    /// its SIGSTOPs still queued is let run to that signal's stop, where
    /// the signal is suppressed, since untraced it would stop for real.
    /// Whatever does not stop within two seconds is detached by the
    /// kernel when memleak exits.
    pub fn detach(&mut self) {
        self.detached = true;
        if self.exited {
            return;
        }
        let mut pending: std::collections::HashSet<u32> = Default::default();
        for pid in std::iter::once(self.pid).chain(self.adopted.iter().copied()) {
            for tid in threads(pid) {
                // SAFETY: a thread we trace (seized).
                if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid as libc::pid_t, 0, 0) } == 0 {
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
            let inject = match event {
                // A new thread or process: detached at its own first stop.
                libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                    let mut new: libc::c_ulong = 0;
                    // SAFETY: the thread is in a ptrace stop; new is writable.
                    unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0, &mut new) };
                    pending.insert(new as u32);
                    0
                }
                // On its way out: it will not stop again.
                libc::PTRACE_EVENT_EXIT => {
                    pending.remove(&tid);
                    // SAFETY: the thread is in a ptrace stop.
                    unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0, 0) };
                    continue;
                }
                // A group-stop stays one once detached (a SIGSTOP of the
                // probe's still queued goes with the next SIGCONT).
                libc::PTRACE_EVENT_STOP if is_stop_signal(sig) => {
                    pending.remove(&tid);
                    // SAFETY: the thread is in a ptrace stop.
                    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
                    continue;
                }
                0 if sig == libc::SIGSTOP && probe_sigstop(tid) => 0,
                0 if sig == libc::SIGTRAP => 0,
                // Someone else's signal: delivered.
                0 => sig,
                _ => 0,
            };
            // A probe's SIGSTOP still to come: taken first, at its stop.
            let request = if sigstop_pending(tid) {
                libc::PTRACE_CONT
            } else {
                pending.remove(&tid);
                libc::PTRACE_DETACH
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recording that fails while the command is held at its exit stop
    /// (the scan's moment) drops the command: SIGKILL alone leaves it in
    /// that stop, and the drop waited for it for ever.
    #[test]
    fn a_command_held_at_its_exit_stop_is_let_go_when_dropped() {
        dropped_and_reaped(|| {
            let mut c = Child::spawn(&["/bin/true".to_string()], false, None, &[]).unwrap();
            c.release(false, &mut || Ok(())).unwrap();
            let pid = c.pid;
            let failed = loop {
                let r = c.poll(
                    &mut |_| Ok(()),
                    &mut || anyhow::bail!("the scan failed"),
                    &mut |_| Ok(()),
                    &mut |_| Ok(()),
                );
                if let Err(e) = r {
                    break e;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            assert_eq!(failed.to_string(), "the scan failed");
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            assert!(state.contains(") t "), "held at its exit stop: {state}");
            c
        });
    }

    /// A recording that fails while a multi-threaded command runs (a full
    /// disk) drops it: its threads reach their exit stops after the
    /// SIGKILL, and the drop waited for them for ever when it had tried
    /// to let go of them only once, right after the kill.
    #[test]
    fn a_running_multi_threaded_command_is_reaped_when_dropped() {
        if std::process::Command::new("python3")
            .arg("-V")
            .output()
            .is_err()
        {
            assert!(
                std::env::var_os("MEMLEAK_REQUIRE_ALL").is_none(),
                "python3 is required (MEMLEAK_REQUIRE_ALL)"
            );
            eprintln!("skipped: python3 is not installed");
            return;
        }
        dropped_and_reaped(|| {
            let script = "import threading, time\n\
                          for _ in range(4): threading.Thread(target=time.sleep, args=(30,)).start()\n\
                          print('started', flush=True)\n\
                          time.sleep(30)";
            let argv = ["python3", "-c", script].map(String::from);
            let mut c = Child::spawn(&argv, false, None, &[]).unwrap();
            c.release(false, &mut || Ok(())).unwrap();
            let pid = c.pid;
            let threads =
                || std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while threads() < 5 && std::time::Instant::now() < deadline {
                c.poll(
                    &mut |_| Ok(()),
                    &mut || Ok(()),
                    &mut |_| Ok(()),
                    &mut |_| Ok(()),
                )
                .unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(threads(), 5, "the command started its threads");
            c
        });
    }

    /// Drops the command `start` returns, on a thread of its own: the drop
    /// returns within 20 s and the command is reaped.
    fn dropped_and_reaped(start: impl FnOnce() -> Child + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let c = start();
            let pid = c.pid;
            drop(c);
            done.send(pid).unwrap();
        });
        let pid = finished
            .recv_timeout(Duration::from_secs(20))
            .expect("dropping the command returned");
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the command was reaped"
        );
    }
}
