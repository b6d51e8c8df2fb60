//! Writing reports to stdout without panicking: a reader that goes away
//! (`| head`, `| true`) or a full disk (`> /dev/full`) is an error that
//! reaches `main`, which exits like a shell expects (see [`exit_code`]).
//!
//! SIGPIPE stays ignored (Rust's default): the recorder must outlive a
//! closed stderr pipe, so a closed stdout shows up as EPIPE here instead.

use std::fmt;
use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

/// A write to stdout that failed.
#[derive(Debug)]
pub struct StdoutError(pub io::Error);

impl fmt::Display for StdoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "writing to stdout: {}", describe(&self.0))
    }
}

impl std::error::Error for StdoutError {}

/// An I/O error without the ` (os error 28)` Rust appends to the
/// system's message.
pub fn describe(e: &io::Error) -> String {
    memleak_trace::describe_io(e)
}

/// Runs `write` on a buffered stdout and flushes it; any write error comes
/// back as a [`StdoutError`]. Stdout's lock is taken once per megabyte
/// written, not held: the JSON report is written from a rayon scope, which
/// needs a `Send` writer, and `StdoutLock` is not one.
pub fn to_stdout(
    write: impl FnOnce(&mut (dyn Write + Send)) -> io::Result<()>,
) -> anyhow::Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, io::stdout());
    write(&mut out)
        .and_then(|()| out.flush())
        .map_err(|e| StdoutError(e).into())
}

/// An error and its causes as one line: each cause once (a context that
/// already ends with its cause's message does not get it again), and OS
/// errors in the system's words.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let raw = cause.to_string();
        let text = match cause.downcast_ref::<io::Error>() {
            Some(io) => describe(io),
            None => raw.clone(),
        };
        if !line.is_empty() && (line.ends_with(&raw) || line.ends_with(&text)) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// How `main` ends on an error: a closed stdout pipe quietly, with 141
/// (128 + SIGPIPE, what a shell reports for a command killed by it); any
/// other error with one line on stderr and status 1.
pub fn exit_code(e: &anyhow::Error) -> ExitCode {
    let closed_pipe = e
        .chain()
        .filter_map(|c| c.downcast_ref::<StdoutError>())
        .any(|s| s.0.kind() == io::ErrorKind::BrokenPipe);
    if closed_pipe {
        return ExitCode::from(141);
    }
    // One line, whole cause chain: scripts grep it, people read it. If
    // stderr is gone too there is no one left to tell.
    let _ = writeln!(io::stderr(), "memleak: error: {}", one_line(e));
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_read_like_the_system_message() {
        let e = StdoutError(io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(e.to_string(), "writing to stdout: No space left on device");
        let e = StdoutError(io::Error::other("custom"));
        assert_eq!(e.to_string(), "writing to stdout: custom");
    }

    #[test]
    fn error_lines_say_each_cause_once() {
        use anyhow::Context;
        let io = || io::Error::from_raw_os_error(libc::EROFS);
        // A context naming the path, over an OS error.
        let e = Err::<(), _>(io()).context("ro/r.txt").unwrap_err();
        assert_eq!(one_line(&e), "ro/r.txt: Read-only file system");
        // A context that already says its cause, as `{e}` in a format
        // string does.
        let e = Err::<(), _>(io())
            .with_context(|| format!("ro/t: {}", io()))
            .unwrap_err();
        assert_eq!(
            one_line(&e),
            "ro/t: Read-only file system (os error 30)",
            "said once, as the context said it"
        );
        let e = anyhow::anyhow!("plain").context("outer");
        assert_eq!(one_line(&e), "outer: plain");
    }
}
