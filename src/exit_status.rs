//! How the traced command ended: an exit code or a signal, said the way
//! a shell says it, the same in `record`'s summary and in `info`.

use std::fmt;

use memleak_trace::Meta;

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal { signal: i32, core_dumped: bool },
}

impl Exit {
    /// From a `waitpid` status of a process that ended.
    #[cfg(feature = "bpf")]
    pub fn from_wait_status(status: libc::c_int) -> Exit {
        if libc::WIFSIGNALED(status) {
            Exit::Signal {
                signal: libc::WTERMSIG(status),
                core_dumped: libc::WCOREDUMP(status),
            }
        } else {
            Exit::Code(libc::WEXITSTATUS(status))
        }
    }

    /// As a trace stores it (`exit_code`, `exit_signal`,
    /// `exit_core_dumped`); `None` when the trace has no exit status.
    pub fn from_meta(m: &Meta) -> Option<Exit> {
        match (m.exit_code, m.exit_signal) {
            (_, Some(signal)) => Some(Exit::Signal {
                signal,
                core_dumped: m.exit_core_dumped,
            }),
            (Some(code), None) => Some(Exit::Code(code)),
            (None, None) => None,
        }
    }

    /// Stores it in a trace's metadata.
    #[cfg(feature = "bpf")]
    pub fn store(exit: Option<Exit>, m: &mut Meta) {
        m.exit_code = exit.map(Exit::shell_code);
        m.exit_signal = exit.and_then(Exit::signal);
        m.exit_core_dumped = matches!(
            exit,
            Some(Exit::Signal {
                core_dumped: true,
                ..
            })
        );
    }

    /// The status a shell reports (`$?`): the exit code, or 128 + the
    /// signal.
    #[cfg(feature = "bpf")]
    pub fn shell_code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal { signal, .. } => 128 + signal,
        }
    }

    /// The signal that killed it, if one did.
    pub fn signal(self) -> Option<i32> {
        match self {
            Exit::Code(_) => None,
            Exit::Signal { signal, .. } => Some(signal),
        }
    }
}

/// `exited with status 7`, `was killed by signal 9 (SIGKILL)`, `was
/// killed by signal 11 (SIGSEGV) (core dumped)`: what follows "the
/// command".
impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Exit::Code(c) => write!(f, "exited with status {c}"),
            Exit::Signal {
                signal,
                core_dumped,
            } => {
                write!(f, "was {}", killed_by(signal))?;
                if core_dumped {
                    write!(f, " (core dumped)")?;
                }
                Ok(())
            }
        }
    }
}

/// `killed by signal 9 (SIGKILL)`, or `killed by signal 99` for a number
/// without a name.
pub fn killed_by(signal: i32) -> String {
    match signal_name(signal) {
        Some(name) => format!("killed by signal {signal} ({name})"),
        None => format!("killed by signal {signal}"),
    }
}

/// The name of a Linux signal (`SIGKILL`, `SIGRTMIN+2`).
pub fn signal_name(signal: i32) -> Option<String> {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        // Real-time signals, numbered from the C library's SIGRTMIN (the
        // ones below it are its own), as `kill -l` names them.
        n if (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&n) => {
            let off = n - libc::SIGRTMIN();
            return Some(match off {
                0 => "SIGRTMIN".to_string(),
                _ if n == libc::SIGRTMAX() => "SIGRTMAX".to_string(),
                _ => format!("SIGRTMIN+{off}"),
            });
        }
        _ => return None,
    };
    Some(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deaths_by_signal_are_named() {
        let kill = Exit::Signal {
            signal: libc::SIGKILL,
            core_dumped: false,
        };
        assert_eq!(kill.to_string(), "was killed by signal 9 (SIGKILL)");
        let segv = Exit::Signal {
            signal: libc::SIGSEGV,
            core_dumped: true,
        };
        assert_eq!(
            segv.to_string(),
            "was killed by signal 11 (SIGSEGV) (core dumped)"
        );
        assert_eq!(Exit::Code(7).to_string(), "exited with status 7");
        assert_eq!(killed_by(99), "killed by signal 99");
        assert_eq!(
            signal_name(libc::SIGRTMIN() + 2).as_deref(),
            Some("SIGRTMIN+2")
        );
        assert_eq!(signal_name(libc::SIGRTMAX()).as_deref(), Some("SIGRTMAX"));
    }

    #[cfg(feature = "bpf")]
    #[test]
    fn wait_statuses_and_meta_round_trip() {
        // A wait status: signal in the low 7 bits, 0x80 if it dumped core.
        let status = libc::SIGABRT | 0x80;
        let e = Exit::from_wait_status(status);
        assert_eq!(
            e,
            Exit::Signal {
                signal: libc::SIGABRT,
                core_dumped: true
            }
        );
        let mut m = Meta::default();
        Exit::store(Some(e), &mut m);
        assert_eq!(m.exit_code, Some(134));
        assert_eq!(m.exit_signal, Some(libc::SIGABRT));
        assert!(m.exit_core_dumped);
        assert_eq!(Exit::from_meta(&m), Some(e));
        assert_eq!(
            Exit::Signal {
                signal: 9,
                core_dumped: false
            }
            .shell_code(),
            137
        );
        assert_eq!(Exit::from_wait_status(3 << 8), Exit::Code(3));
        Exit::store(Some(Exit::Code(3)), &mut m);
        assert_eq!((m.exit_code, m.exit_signal), (Some(3), None));
        assert!(!m.exit_core_dumped);
    }
}
