//! The signals `memleak record` acts on: SIGINT and SIGTERM end the
//! recording (and are passed on to a command it started, as timeout(1)
//! does, see [`Stopping`]); stop signals suspend memleak with its
//! command's job (see [`Suspending`]).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::child::Child;
use crate::exit_status::{self, Exit};
use crate::units::format_duration;

/// SIGINT and SIGTERM received so far.
static SIGNALS: AtomicU32 = AtomicU32::new(0);
/// The last of them.
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Whether the terminal sent it (Ctrl-C): then it went to the whole
/// foreground process group, and a command in ours has it already.
static FROM_TERMINAL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let code = unsafe { info.as_ref() }.map_or(0, |i| i.si_code);
    FROM_TERMINAL.store(code == libc::SI_KERNEL, Ordering::SeqCst);
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// A handler that gets the siginfo (to tell the terminal's signals).
type InfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Installs `handler` for `signals` (SA_SIGINFO, SA_RESTART).
fn catch(signals: &[libc::c_int], handler: InfoHandler) {
    // SAFETY: the handlers only store to atomics; the struct is filled.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        for &sig in signals {
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

pub(super) fn catch_stop_signals() {
    catch(&[libc::SIGINT, libc::SIGTERM], on_signal);
}

/// A SIGCHLD came (a traced thread stopped or exited) since the recorder
/// last slept.
static CHILD_EVENT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_child(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    CHILD_EVENT.store(true, Ordering::SeqCst);
}

/// Makes a traced thread's stop or exit end the recorder's sleep between
/// drains ([`sleep_unless_child_event`]). The thread stays stopped until
/// the recorder handles the stop: a new thread, a thread's exit, the exit
/// of the command waited up to a poll interval (10 ms) each, which made a
/// program that starts and ends 4 threads take 40 to 70 ms longer.
/// SIGCHLD is caught, and blocked in this thread (and the threads it
/// starts after) except while it sleeps. Call it after the command is
/// started: the command must not inherit the blocked signal.
pub(super) fn catch_child_events() {
    catch(&[libc::SIGCHLD], on_child);
    child_signal(libc::SIG_BLOCK);
    CATCHING_CHILD_EVENTS.store(true, Ordering::SeqCst);
}

/// Whether [`catch_child_events`] was called.
static CATCHING_CHILD_EVENTS: AtomicBool = AtomicBool::new(false);

fn child_signal(how: libc::c_int) {
    // SAFETY: a signal set on the stack, filled before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Runs `sleep` with SIGCHLD unblocked, so that a traced thread's stop
/// interrupts it (EINTR: futex and epoll waits end on a caught signal
/// whatever SA_RESTART says), or with `Duration::ZERO` if one came since
/// the last sleep. Without [`catch_child_events`], or not to sleep at
/// all, just `sleep(timeout)`.
pub(super) fn sleep_unless_child_event<T>(
    timeout: Duration,
    sleep: impl FnOnce(Duration) -> T,
) -> T {
    if timeout.is_zero() || !CATCHING_CHILD_EVENTS.load(Ordering::SeqCst) {
        return sleep(timeout);
    }
    child_signal(libc::SIG_UNBLOCK);
    let timeout = match CHILD_EVENT.swap(false, Ordering::SeqCst) {
        true => Duration::ZERO,
        false => timeout,
    };
    let r = sleep(timeout);
    child_signal(libc::SIG_BLOCK);
    r
}

/// A stop signal (SIGTSTP, SIGTTIN, SIGTTOU) memleak received while it
/// records a command, not yet acted on; 0 if none.
static SUSPEND: AtomicI32 = AtomicI32::new(0);
/// Whether the terminal sent it (Ctrl-Z, or a background job's access to
/// the terminal): then the whole process group got it.
static SUSPEND_FROM_TERMINAL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_suspend(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let code = unsafe { info.as_ref() }.map_or(0, |i| i.si_code);
    SUSPEND_FROM_TERMINAL.store(code == libc::SI_KERNEL, Ordering::SeqCst);
    SUSPEND.store(sig, Ordering::SeqCst);
}

/// While memleak records a command that shares its job (no --detach), a
/// stop signal does not stop memleak at once: see [`Suspending`].
pub(super) fn catch_suspend_signals() {
    catch(&[libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU], on_suspend);
}

/// How long memleak, asked to stop, waits for its command to stop first.
/// A command that ignores or handles the signal and runs on keeps memleak
/// running too, as the job would run on without memleak.
const SUSPEND_WAIT: Duration = Duration::from_secs(1);

/// memleak was sent a stop signal (Ctrl-Z, `kill -TSTP`) while recording
/// a command in its job: like the rest of the job, it stops, but only
/// once the command has (every thread in a group-stop), so that the
/// command does not run on untended and the shell sees the job stopped
/// when it is. A signal sent to memleak alone is passed on to the
/// command, and so is, then, the SIGCONT that resumes memleak; one the
/// terminal sent reached the command's process group already, as the
/// SIGCONT of the shell's `fg` and `bg` will.
pub(super) struct Suspending {
    signal: libc::c_int,
    passed_on: bool,
    since: Instant,
}

impl Suspending {
    /// The stop signal memleak received since the last call, if any, and
    /// what it does about it.
    pub(super) fn received(c: &Child) -> Option<Suspending> {
        let sig = SUSPEND.swap(0, Ordering::SeqCst);
        (sig != 0).then(|| {
            let from_terminal = SUSPEND_FROM_TERMINAL.load(Ordering::SeqCst);
            Suspending::begin(c, sig, from_terminal)
        })
    }

    /// Stops memleak once the command has stopped (calling `before`
    /// first), and continues the command after memleak is continued if
    /// memleak passed the signal on. True when this suspension is over:
    /// done, or given up after [`SUSPEND_WAIT`] because the command runs on.
    pub(super) fn settle(&self, c: &Child, before: impl FnOnce()) -> bool {
        if c.all_stopped() {
            before();
            stop_self(self.signal);
            if self.passed_on {
                c.signal(libc::SIGCONT);
            }
            true
        } else {
            self.since.elapsed() >= SUSPEND_WAIT
        }
    }

    fn begin(c: &Child, signal: libc::c_int, from_terminal: bool) -> Suspending {
        let passed_on = !(from_terminal && c.in_our_process_group());
        if passed_on {
            c.signal(signal);
        }
        Suspending {
            signal,
            passed_on,
            since: Instant::now(),
        }
    }
}

/// Stops memleak with `sig` as its default action would, and returns once
/// memleak is continued (SIGCONT).
fn stop_self(sig: libc::c_int) {
    // SAFETY: sigaction with filled structs; raise has no preconditions.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        let mut ours: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &dfl, &mut ours);
        libc::raise(sig);
        libc::sigaction(sig, &ours, std::ptr::null_mut());
    }
}

pub(super) fn signal_name(sig: libc::c_int) -> String {
    exit_status::signal_name(sig).unwrap_or_else(|| format!("signal {sig}"))
}

/// How long a command gets to exit after SIGTERM (or a passed-on signal)
/// before it is killed, without --kill-after.
pub(super) const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(5);
/// How long after SIGKILL memleak still waits for the command.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// A command memleak started, being stopped because the recording ends
/// (--duration, or a SIGINT or SIGTERM memleak received): like timeout(1),
/// it is sent the signal, recorded until it exits, and killed if it takes
/// longer than --kill-after.
pub(super) struct Stopping {
    /// The signal the command got first.
    signal: libc::c_int,
    /// Why memleak ended the recording when no signal did: "after
    /// --duration 10s", "after 3 reports".
    why: String,
    /// The signal came from the terminal to the command itself.
    from_terminal: bool,
    since: Instant,
    signals_seen: u32,
    /// When SIGKILL was sent, and why.
    killed: Option<(Instant, String)>,
}

impl Stopping {
    pub(super) fn begin(c: &Child, signals: u32, why: String) -> Stopping {
        let (signal, why, from_terminal) = if signals > 0 {
            let sig = LAST_SIGNAL.load(Ordering::SeqCst);
            let from_terminal = FROM_TERMINAL.load(Ordering::SeqCst) && c.in_our_process_group();
            (sig, String::new(), from_terminal)
        } else {
            (libc::SIGTERM, why, false)
        };
        if !from_terminal {
            c.signal(signal);
        }
        // A stopped command would not act on it before --kill-after's
        // SIGKILL: as timeout(1) does, it is continued.
        if c.stopped() {
            c.signal(libc::SIGCONT);
        }
        Stopping {
            signal,
            why,
            from_terminal,
            since: Instant::now(),
            signals_seen: signals,
            killed: None,
        }
    }

    /// Sends SIGKILL on a second SIGINT or SIGTERM, or after `kill_after`.
    pub(super) fn escalate(&mut self, c: &Child, signals: u32, kill_after: Duration) {
        if self.killed.is_some() {
            return;
        }
        let why = if signals > self.signals_seen {
            format!(
                "on a second {}",
                signal_name(LAST_SIGNAL.load(Ordering::SeqCst))
            )
        } else if self.since.elapsed() >= kill_after {
            format!("after --kill-after {}", format_duration(kill_after))
        } else {
            return;
        };
        c.signal(libc::SIGKILL);
        self.killed = Some((Instant::now(), why));
    }

    /// SIGKILL was sent long ago and the command is still there.
    pub(super) fn given_up(&self) -> bool {
        self.killed
            .as_ref()
            .is_some_and(|(t, _)| t.elapsed() > KILL_GRACE)
    }

    /// What happened, for the summary.
    pub(super) fn describe(&self, pid: u32, exit: Option<Exit>) -> String {
        let sig = signal_name(self.signal);
        let mut out = match (self.why.as_str(), self.from_terminal) {
            (why, _) if !why.is_empty() => format!("sent {sig} to the command (pid {pid}) {why}"),
            (_, true) => format!("the command (pid {pid}) got {sig} from the terminal"),
            (_, false) => format!("passed {sig} on to the command (pid {pid})"),
        };
        if let Some((_, why)) = &self.killed {
            out += &format!(", then SIGKILL {why}");
        }
        match exit {
            Some(exit) => out + &format!("; it {exit}"),
            None => {
                out + &format!(
                    "; it did not exit within {} of SIGKILL",
                    format_duration(KILL_GRACE)
                )
            }
        }
    }
}

/// How many SIGINTs and SIGTERMs memleak received so far.
pub(super) fn stop_signals_received() -> u32 {
    SIGNALS.load(Ordering::SeqCst)
}
