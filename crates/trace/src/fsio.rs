//! How memleak creates and replaces files, in one place: the trace's
//! segments and `meta.json` (crate-private helpers, and the checksumming
//! sink every segment is written through), and every report the CLI
//! writes for the user ([`replace_file`]).
//!
//! A file is replaced by writing a temporary file beside it and renaming
//! that over it, so a reader, a crash or a full disk never sees half of
//! one; nothing is ever opened through a symbolic link.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Creates a file readable by its owner only: traces hold addresses and
/// command lines of other people's processes.
pub(crate) fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Replaces `path` with `bytes` atomically: written to `tmp` (a private
/// file in the same directory), fsynced, then renamed over `path`, so a
/// crash leaves either the old or the new file, never half of one.
pub(crate) fn replace_atomically(path: &Path, tmp: &Path, bytes: &[u8]) -> io::Result<()> {
    let file = create_private(tmp)?;
    commit(file, tmp, path, |f| f.write_all(bytes))
}

/// A segment file being written. Every byte goes through a CRC-32 on its
/// way to the file (segments are written front to back), so the checksum
/// `meta.json` lists costs no second read.
pub(crate) struct SegmentSink {
    file: File,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl SegmentSink {
    pub(crate) fn new(file: File) -> Self {
        SegmentSink {
            file,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        }
    }

    /// Fsyncs the file, and returns its length and CRC-32: what
    /// `meta.json` lists of a closed segment.
    pub(crate) fn sync(self) -> io::Result<(u64, u32)> {
        self.file.sync_all()?;
        Ok((self.bytes, self.crc.finalize()))
    }
}

impl Write for SegmentSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// A temporary file, removed unless it was renamed into place.
struct Temporary<'a> {
    path: &'a Path,
    renamed: bool,
}

impl Drop for Temporary<'_> {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = fs::remove_file(self.path);
        }
    }
}

/// Fills `file` (open at `tmp`) with `write`, fsyncs it and renames it
/// over `path`. On any error, `tmp` is removed and `path` left as it was.
fn commit(
    mut file: File,
    tmp: &Path,
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let mut temporary = Temporary {
        path: tmp,
        renamed: false,
    };
    write(&mut file)?;
    file.sync_all()?;
    fs::rename(tmp, path)?;
    temporary.renamed = true;
    Ok(())
}

/// Writes the file at `path` with what `write` writes, the way memleak
/// writes every report:
///
/// * a regular file (or nothing) at `path` is replaced atomically: the
///   output goes to a new temporary file in the same directory, created
///   with `O_EXCL | O_NOFOLLOW`, which is fsynced and renamed over `path`,
///   or removed if anything fails, leaving `path` as it was. The new file
///   has mode 0600, or the mode of the file it replaces if that file was
///   ours (same owner); a file of another user is not given its mode
///   (whoever planted it could read what we write);
/// * a symbolic link at `path` is refused, not followed: nothing is
///   written through one (the rename would replace a link planted after
///   the check, never follow it);
/// * a FIFO or a character device (`/dev/null`, a named pipe) is written
///   in place, opened with `O_NOFOLLOW` and never created or truncated;
/// * anything else (a directory, a socket, a block device) is refused.
///
/// Refusals are errors of kind `InvalidInput` whose message says what is
/// at `path`; none names `path`, which the caller does.
pub fn replace_file(
    path: &Path,
    write: impl FnOnce(&mut (dyn Write + Send)) -> io::Result<()>,
) -> io::Result<()> {
    let refuse = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
    let mode = match path.symlink_metadata() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0o600,
        Err(e) => return Err(e),
        Ok(md) => {
            let t = md.file_type();
            if t.is_symlink() {
                return Err(refuse("is a symbolic link; not writing through it"));
            } else if t.is_dir() {
                return Err(io::Error::from_raw_os_error(libc::EISDIR));
            } else if t.is_fifo() || t.is_char_device() {
                return write_in_place(path, write);
            } else if !t.is_file() {
                return Err(refuse(
                    "is not a regular file, a FIFO or a character device; not replacing it",
                ));
            }
            // SAFETY: geteuid has no preconditions.
            if md.uid() == unsafe { libc::geteuid() } {
                md.mode() & 0o777
            } else {
                0o600
            }
        }
    };
    let (tmp, file) = create_temporary(path)?;
    if mode != 0o600 {
        // Exactly the old mode, whatever the umask.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
    }
    commit(file, &tmp, path, |f| buffered(f, write))
}

/// Runs `write` through a 1 MiB buffer on `f`, flushed at the end.
fn buffered(
    f: &mut File,
    write: impl FnOnce(&mut (dyn Write + Send)) -> io::Result<()>,
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, f);
    write(&mut w)?;
    w.flush()
}

/// A FIFO or a character device named by the user: opened for writing as
/// it is, without following a link put there since it was looked at, and
/// checked again once open.
fn write_in_place(
    path: &Path,
    write: impl FnOnce(&mut (dyn Write + Send)) -> io::Result<()>,
) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if !(t.is_fifo() || t.is_char_device()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "was replaced while being opened; not writing to it",
        ));
    }
    buffered(&mut f, write)
}

/// A new, private file beside `path` (`.NAME.memleak-PID-N.tmp`, N
/// unpredictable), created with `O_EXCL | O_NOFOLLOW`: never a file or
/// link someone else put there.
fn create_temporary(path: &Path) -> io::Result<(PathBuf, File)> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "names no file; not writing it")
    })?;
    // A prefix of the name says whose temporary it is; it is cut to keep
    // the whole name within NAME_MAX.
    let mut prefix = name.to_string_lossy().into_owned();
    while prefix.len() > 200 {
        prefix.pop();
    }
    let pid = std::process::id();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut seed = now.as_nanos() as u64 ^ u64::from(pid) << 32;
    let mut last = None;
    for _ in 0..64 {
        // xorshift: a name another user cannot guess in advance.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let tmp = dir.join(format!(".{prefix}.memleak-{pid}-{:08x}.tmp", seed as u32));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("64 attempts"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".memleak-"))
            .collect()
    }

    #[test]
    fn a_new_file_is_private_and_complete() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.txt");
        replace_file(&p, |w| w.write_all(b"report")).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"report");
        assert_eq!(p.metadata().unwrap().mode() & 0o7777, 0o600);
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_replaced_file_of_ours_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.txt");
        fs::write(&p, "old, longer than the new one").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        replace_file(&p, |w| w.write_all(b"new")).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(p.metadata().unwrap().mode() & 0o7777, 0o640);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.txt");
        fs::write(&p, "old").unwrap();
        let e = replace_file(&p, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("renderer failed"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "renderer failed");
        assert_eq!(fs::read(&p).unwrap(), b"old");
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_symbolic_link_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let p = dir.path().join("r.html");
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        let e = replace_file(&p, |w| w.write_all(b"report")).unwrap_err();
        assert_eq!(e.to_string(), "is a symbolic link; not writing through it");
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(p.symlink_metadata().unwrap().file_type().is_symlink());
        // A dangling link is refused too, and not created through.
        let dangling = dir.path().join("d.html");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(replace_file(&dangling, |w| w.write_all(b"x")).is_err());
        assert!(!dir.path().join("nowhere").exists());
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_character_device_is_written_in_place() {
        replace_file(Path::new("/dev/null"), |w| w.write_all(b"gone")).unwrap();
        assert!(Path::new("/dev/null")
            .metadata()
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = replace_file(dir.path(), |w| w.write_all(b"x")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
    }
}
