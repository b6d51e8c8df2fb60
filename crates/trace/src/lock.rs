//! The recorder's lock on its trace directory.
//!
//! A recording holds an exclusive lock on `TRACE/.memleak.lock` from before it
//! writes anything until it ends, so that a second `record -o TRACE`, with
//! or without `--force`, refuses the trace instead of deleting it under the
//! first. The lock is an open file description lock (`fcntl(F_OFD_SETLK)`):
//! like `flock(2)` it belongs to the open file, not to a pid, and the
//! kernel drops it when the recorder exits or is killed, so a lock file
//! left by a `kill -9` locks nothing. Unlike `flock(2)` it can be tested
//! without taking it (`F_OFD_GETLK`), so asking who holds a trace never
//! makes a recorder starting at that moment fail. The file holds the
//! holder's pid, for the error message only: whether a trace is locked is
//! the kernel's answer, never the file's.
//!
//! Readers (`info`, `analyze`, DuckDB) never take the lock: a trace is
//! readable while it is recorded (docs/format.md).

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};

/// The lock file's name in the trace directory. A dot file: Hive-style
/// readers (pyarrow datasets, Spark) skip it, and no table glob matches it.
pub const LOCK_FILE: &str = ".memleak.lock";

/// An exclusive lock on a trace directory. Clones share the lock, which is
/// released when the last of them is dropped (or the process ends).
#[derive(Clone, Debug)]
pub struct TraceLock {
    file: Arc<File>,
    root: PathBuf,
}

/// How many times [`TraceLock::acquire`] takes a lock on a file that was
/// replaced or removed meanwhile before it gives up.
const ATTEMPTS: usize = 16;

impl TraceLock {
    /// Locks the existing directory `root`, creating its lock file if
    /// needed, and writes our pid into it. Fails with [`Error::Locked`]
    /// if another process holds the lock.
    pub(crate) fn acquire(root: &Path) -> Result<TraceLock> {
        let path = root.join(LOCK_FILE);
        for _ in 0..ATTEMPTS {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                // Never write through a link someone put in our place.
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            let mut fl = whole_file(libc::F_WRLCK);
            // SAFETY: fcntl on a descriptor we own, with a valid flock.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) } != 0 {
                let e = std::io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EACCES) => Err(Error::Locked {
                        path: root.to_path_buf(),
                        pid: read_pid(&file),
                    }),
                    _ => Err(Error::io(&path, e)),
                };
            }
            // A recorder that ends removes the lock file while it holds the
            // lock; if it did so between our open and our lock, ours is on a
            // file no one else will open: take the one at the path instead.
            if !same_file(&file, &path) {
                continue;
            }
            // The pid is only for messages: a failure to write it (a full
            // disk) leaves the lock held, and the message says "pid unknown".
            let pid = format!("{}\n", std::process::id());
            if file.write_all_at(pid.as_bytes(), 0).is_ok() {
                let _ = file.set_len(pid.len() as u64);
            }
            return Ok(TraceLock {
                file: Arc::new(file),
                root: root.to_path_buf(),
            });
        }
        Err(Error::io(
            &path,
            std::io::Error::other("the lock file keeps being replaced"),
        ))
    }

    /// The locked trace directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Removes the lock file, keeping the lock: once a recording is
    /// complete, a trace needs no lock file. Whoever opened it meanwhile
    /// finds it gone when it gets the lock, and starts again.
    pub(crate) fn remove_file(&self) {
        let path = self.root.join(LOCK_FILE);
        if same_file(&self.file, &path) {
            let _ = fs::remove_file(path);
        }
    }
}

/// Who holds the lock of the trace at `root`: `None` when no one does (or
/// there is no lock file), `Some(pid)` when a recorder does (`Some(None)`
/// when its pid is unknown). Takes no lock, creates nothing.
pub fn holder(root: &Path) -> Option<Option<u32>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(root.join(LOCK_FILE))
        .ok()?;
    let mut fl = whole_file(libc::F_WRLCK);
    // SAFETY: fcntl on a descriptor we own, with a valid flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) } != 0 {
        return None;
    }
    (fl.l_type != libc::F_UNLCK as libc::c_short).then(|| read_pid(&file))
}

/// Whether `path` names the file open as `file`.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), path.symlink_metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// A lock request for the whole file (`l_pid` 0, as OFD locks require).
fn whole_file(kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is plain old data; zero is a valid value of each field.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl
}

/// The pid the holder wrote into the lock file, if it reads as one.
fn read_pid(mut file: &File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.lines().next()?.trim().parse().ok()
}
