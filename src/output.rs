//! Where reports go, and how errors end the program.
//!
//! Reports go to stdout without panicking: a reader that goes away
//! (`| head`, `| true`) or a full disk (`> /dev/full`) is an error that
//! reaches `main`, which exits like a shell expects (see [`exit_code`]).
//! SIGPIPE stays ignored (Rust's default): the recorder must outlive a
//! closed stderr pipe, so a closed stdout shows up as EPIPE here instead.
//!
//! Or they go to a file (`-o`), always through [`to_file`]: replaced
//! atomically, never written through a symbolic link, mode 0600 unless
//! it replaces a file of ours (`memleak_trace::fsio::replace_file`).

use std::fmt;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
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

/// Writes a report to the file `path` (see the module's doc); an error
/// is one message naming `path` and the cause, once.
pub fn to_file(
    path: &Path,
    write: impl FnOnce(&mut (dyn Write + Send)) -> io::Result<()>,
) -> anyhow::Result<()> {
    memleak_trace::fsio::replace_file(path, write)
        .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), describe(&e)))
}

/// Writes to `path`, or to stdout without one.
pub fn to_file_or_stdout(
    path: Option<&Path>,
    write: impl FnOnce(&mut (dyn Write + Send)) -> io::Result<()>,
) -> anyhow::Result<()> {
    match path {
        Some(p) => to_file(p, write),
        None => to_stdout(write),
    }
}

/// Writes `input` in `format` to `path`, or to stdout without one: how
/// every command writes its report, whatever the format.
pub fn emit<T: ?Sized>(
    path: Option<&Path>,
    format: &dyn memleak_analyze::Render<T>,
    input: &T,
) -> anyhow::Result<()> {
    to_file_or_stdout(path, |w| format.write(input, w))
}

/// Writes bytes already rendered to `path`, or to stdout without one.
pub fn emit_bytes(path: Option<&Path>, bytes: &[u8]) -> anyhow::Result<()> {
    to_file_or_stdout(path, |w| w.write_all(bytes))
}

/// Makes `dir` a directory to write reports into: created (mode 0700, as
/// the files in it are private) if missing, refused if it is a symbolic
/// link (nothing is written through one) or not a directory.
pub fn report_dir(dir: &Path) -> anyhow::Result<()> {
    let fail = |what: String| anyhow::anyhow!("{}: {what}", dir.display());
    match dir.symlink_metadata() {
        Ok(md) if md.file_type().is_symlink() => Err(fail(
            "is a symbolic link; not writing through it".to_string(),
        )),
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(fail(describe(&io::Error::from_raw_os_error(libc::ENOTDIR)))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fail(describe(&e))),
        Err(e) => Err(fail(describe(&e))),
    }
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
