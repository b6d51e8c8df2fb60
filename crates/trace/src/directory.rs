//! Which directories memleak may write a trace into or remove: an empty
//! one, or a memleak trace holding only what memleak writes, never `/`,
//! the working directory or one of its parents; and a trace being
//! recorded only by the recorder that holds its lock ([`TraceLock`]).
//! [`TraceWriter::create`](crate::writer::TraceWriter::create) claims its
//! directory here, `--force` empties one here, and [`remove_trace`]
//! removes one (docs/format.md, "The lock").

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::lock::{self, TraceLock, LOCK_FILE};
use crate::meta::Meta;
use crate::schema::Table;

/// Makes `root` ready for a new trace and locks it: creates the directory,
/// or, with `force`, empties an existing trace or empty directory (the
/// rules of [`remove_trace`]) once it holds its lock. Returns the lock and
/// whether it made the directory.
pub(crate) fn lock_output(root: &Path, force: bool) -> Result<(TraceLock, bool)> {
    match root.symlink_metadata() {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match fs::DirBuilder::new().mode(0o700).create(root) {
                Ok(()) => {
                    return match TraceLock::acquire(root) {
                        Ok(lock) => Ok((lock, true)),
                        Err(e) => {
                            // Gone unless someone else wrote in it meanwhile.
                            let _ = fs::remove_dir(root);
                            Err(e)
                        }
                    };
                }
                // Made meanwhile, by another recorder perhaps.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io(root, e)),
            }
        }
        Err(e) => return Err(Error::io(root, e)),
    }
    if !force {
        // Name the recorder that holds it, if it is a trace (anything
        // else may have such a file of its own).
        return Err(match lock::holder(root) {
            Some(pid) if ours(root).is_ok() => Error::Locked {
                path: root.to_path_buf(),
                pid,
            },
            _ => Error::Exists(root.to_path_buf()),
        });
    }
    // Checked before the lock file is created in it: nothing is written
    // into what is not a trace.
    ours(root)?;
    let lock = TraceLock::acquire(root)?;
    // Checked again, under the lock: the recorder it was locked by (if
    // any) may have written more meanwhile.
    let (files, dirs) = ours(root)?;
    remove_all(
        files
            .iter()
            .filter(|f| f.file_name() != Some(LOCK_FILE.as_ref())),
        &dirs,
    )?;
    Ok((lock, false))
}

/// Removes the trace at `root`, and nothing else: `root` must be an empty
/// directory or a memleak trace (its `meta.json` says so) holding only
/// what memleak writes, and must not be `/`, the working directory or one
/// of its parents. Anything else is left as it is and named in the error.
/// A trace being recorded is refused ([`Error::Locked`]): it is locked
/// first, and removed under the lock.
pub fn remove_trace(root: &Path) -> Result<()> {
    ours(root)?;
    let _lock = TraceLock::acquire(root)?;
    remove_locked(root)
}

impl TraceLock {
    /// Removes the trace this lock holds, as [`remove_trace`] would,
    /// without letting go of it meanwhile: for a recorder that recorded
    /// nothing and leaves nothing behind.
    pub fn remove_trace(&self) -> Result<()> {
        remove_locked(self.path())
    }
}

/// [`remove_trace`] for the holder of the trace's lock.
fn remove_locked(root: &Path) -> Result<()> {
    let (files, dirs) = ours(root)?;
    remove_all(files.iter(), &dirs)?;
    fs::remove_dir(root).map_err(|e| Error::io(root, e))
}

fn remove_all<'a>(files: impl Iterator<Item = &'a PathBuf>, dirs: &[PathBuf]) -> Result<()> {
    for f in files {
        fs::remove_file(f).map_err(|e| Error::io(f, e))?;
    }
    for d in dirs {
        fs::remove_dir(d).map_err(|e| Error::io(d, e))?;
    }
    Ok(())
}

/// Files memleak writes at the top of a trace besides `meta.json`: a
/// directory holding nothing else is as good as empty.
const OWN_FILES: [&str; 2] = [LOCK_FILE, ".meta.json.tmp"];

/// What [`remove_trace`] would remove of `root`, files then directories;
/// or why it must not be removed.
fn ours(root: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let refuse = |reason: &str| Error::NotReplaced {
        path: root.to_path_buf(),
        reason: reason.to_string(),
    };
    let md = root.symlink_metadata().map_err(|e| Error::io(root, e))?;
    if md.file_type().is_symlink() {
        return Err(refuse("a symbolic link"));
    }
    if !md.is_dir() {
        return Err(refuse("a file, not a memleak trace"));
    }
    let real = fs::canonicalize(root).map_err(|e| Error::io(root, e))?;
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|d| fs::canonicalize(d).ok());
    if real.parent().is_none() || cwd.is_some_and(|cwd| cwd.starts_with(&real)) {
        return Err(refuse(
            "the root, the working directory or one of its parents",
        ));
    }
    let entries: Vec<PathBuf> = fs::read_dir(root)
        .map_err(|e| Error::io(root, e))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(|e| Error::io(root, e))?;
    let is_file = |p: &Path| p.symlink_metadata().is_ok_and(|m| m.is_file());
    let own_file = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| OWN_FILES.contains(&n))
            && is_file(p)
    };
    if entries.iter().all(|p| own_file(p)) {
        // Empty, or a recorder stopped before its first meta.json.
        return Ok((entries, Vec::new()));
    }
    match Meta::load(root) {
        Ok(_) => {}
        Err(Error::NotATrace { .. }) => return Err(refuse("not a memleak trace")),
        Err(Error::Corrupt { .. }) => {
            return Err(refuse("its meta.json is not a memleak trace's"));
        }
        Err(e) => return Err(e),
    }
    // Everything must be ours before anything goes.
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for path in &entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let is_table = Table::ALL.iter().any(|t| t.name() == name);
        if (name == "meta.json" && is_file(path)) || own_file(path) {
            files.push(path.clone());
        } else if is_table && path.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            for e in fs::read_dir(path).map_err(|e| Error::io(path, e))? {
                let p = e.map_err(|e| Error::io(path, e))?.path();
                let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let ours = n.starts_with("part-")
                    && (n.ends_with(".parquet") || n.ends_with(".parquet.inprogress"))
                    && is_file(&p);
                if !ours {
                    return Err(Error::NotReplaced {
                        path: root.to_path_buf(),
                        reason: format!("{} was not written by memleak", p.display()),
                    });
                }
                files.push(p);
            }
            dirs.push(path.clone());
        } else {
            return Err(Error::NotReplaced {
                path: root.to_path_buf(),
                reason: format!("{} was not written by memleak", path.display()),
            });
        }
    }
    Ok((files, dirs))
}
