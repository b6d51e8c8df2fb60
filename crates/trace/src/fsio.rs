//! File helpers shared by the writer and `meta.json`: how the trace's
//! files are created and replaced, in one place, so neither module has to
//! reach into the other.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Creates a file readable by its owner only: traces hold addresses and
/// command lines of other people's processes.
pub(crate) fn create_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Replaces `path` with `bytes` atomically: written to `tmp` (a private
/// file in the same directory), fsynced, then renamed over `path`, so a
/// crash leaves either the old or the new file, never half of one. A
/// failure (a full disk) removes `tmp` again: no empty or partial file is
/// left beside `path`.
pub(crate) fn replace_atomically(path: &Path, tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = create_private(tmp)?;
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| fs::rename(tmp, path));
    if written.is_err() {
        let _ = fs::remove_file(tmp);
    }
    written
}
