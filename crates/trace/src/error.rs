//! Errors of the trace format. Every variant renders as one line that names
//! the path and the cause, because the CLI prints them verbatim.

use std::path::{Path, PathBuf};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong reading or writing a trace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path does not exist.
    #[error("{}: no such file or directory", .0.display())]
    Missing(PathBuf),
    /// The path exists but is not a memleak trace directory.
    #[error("{}: not a memleak trace ({reason})", path.display())]
    NotATrace {
        /// The offending path.
        path: PathBuf,
        /// Why it is not a trace.
        reason: String,
    },
    /// A Parquet file that memleak did not write, or for another table.
    #[error("{}: foreign Parquet file ({reason})", path.display())]
    Foreign {
        /// The offending file.
        path: PathBuf,
        /// What did not match.
        reason: String,
    },
    /// The trace was written by a newer, incompatible format.
    #[error("{}: trace format {found} is newer than this memleak supports ({supported}); upgrade memleak", path.display())]
    NewerVersion {
        /// The trace directory.
        path: PathBuf,
        /// Version found in meta.json.
        found: String,
        /// Highest version this build reads.
        supported: String,
    },
    /// A segment or metadata file that cannot be decoded.
    #[error("{}: corrupt ({reason})", path.display())]
    Corrupt {
        /// The offending file.
        path: PathBuf,
        /// Decoder message.
        reason: String,
    },
    /// The output already exists and overwriting was not requested.
    #[error("{}: already exists (use --force to overwrite)", .0.display())]
    Exists(PathBuf),
    /// Another memleak holds the trace's lock: it is recording to it.
    #[error("{}: another memleak ({}) is recording to it; not touching it", path.display(), match pid { Some(p) => format!("pid {p}"), None => "pid unknown".to_string() })]
    Locked {
        /// The trace directory.
        path: PathBuf,
        /// The recorder's pid, as its lock file gives it.
        pid: Option<u32>,
    },
    /// `--force` was asked to replace something that is not a trace.
    #[error("{}: not replacing it: {reason}", path.display())]
    NotReplaced {
        /// The output path.
        path: PathBuf,
        /// What it is.
        reason: String,
    },
    /// The disk filled up; closed segments stay valid.
    #[error("{}: no space left on device; segments closed before this point are intact", .0.display())]
    DiskFull(PathBuf),
    /// Any other I/O failure. The OS error is part of the message, not
    /// its `source()`: a chain printer (anyhow's `{:#}`) would print it
    /// twice.
    #[error("{}: {}", path.display(), describe_io(error))]
    Io {
        /// The file being accessed.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
}

/// An I/O error as the system words it: Rust's message without the
/// ` (os error N)` it appends (`Read-only file system`, not `Read-only
/// file system (os error 30)`).
pub fn describe_io(e: &std::io::Error) -> String {
    let text = e.to_string();
    match e.raw_os_error() {
        Some(code) => text
            .strip_suffix(&format!(" (os error {code})"))
            .map(str::to_string)
            .unwrap_or(text),
        None => text,
    }
}

impl Error {
    /// [`Error::Corrupt`] for `path`, saying why.
    pub(crate) fn corrupt(path: &Path, reason: impl std::fmt::Display) -> Self {
        Error::Corrupt {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }

    /// Wraps an I/O error, turning ENOSPC into [`Error::DiskFull`].
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            Error::DiskFull(path.to_path_buf())
        } else {
            Error::Io {
                path: path.to_path_buf(),
                error: source,
            }
        }
    }

    /// Wraps a Parquet error raised while writing `path`.
    pub(crate) fn parquet_write(path: &Path, e: parquet::errors::ParquetError) -> Self {
        match e {
            parquet::errors::ParquetError::External(inner) => {
                match inner.downcast::<std::io::Error>() {
                    Ok(io) => Error::io(path, *io),
                    Err(other) => Error::Corrupt {
                        path: path.to_path_buf(),
                        reason: other.to_string(),
                    },
                }
            }
            other => {
                let msg = other.to_string();
                if msg.contains("No space left") {
                    Error::DiskFull(path.to_path_buf())
                } else {
                    Error::Corrupt {
                        path: path.to_path_buf(),
                        reason: msg,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OS error is said once, in the system's words, and is not also
    /// the error's source (which `{:#}` chain printers would add again).
    #[test]
    fn io_errors_name_the_cause_once() {
        let e = Error::io(
            Path::new("ro/t"),
            std::io::Error::from_raw_os_error(libc::EROFS),
        );
        assert_eq!(e.to_string(), "ro/t: Read-only file system");
        assert!(std::error::Error::source(&e).is_none());
        let custom = std::io::Error::other("custom");
        assert_eq!(describe_io(&custom), "custom");
    }
}
