//! Finding the traces of a dataset: a directory tree holding many traces,
//! laid out as Hive partitions (`ROOT/host=H/trace=ID/`, what `record
//! --dataset ROOT` writes), or any tree of trace directories.
//!
//! A directory is a trace when it holds a `meta.json` file; the walk does
//! not look inside a trace, skips hidden entries (`.name`) and follows no
//! symbolic link, so a link cannot make it loop or leave the tree.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A trace found under a dataset root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundTrace {
    /// The trace directory.
    pub path: PathBuf,
    /// The value of the nearest `host=` component of its path, if any.
    pub host: Option<String>,
    /// The value of the nearest `trace=` component of its path, if any.
    pub trace: Option<String>,
}

/// Whether `dir` is a trace directory: it holds `meta.json`.
pub fn is_trace(dir: &Path) -> bool {
    dir.join("meta.json")
        .symlink_metadata()
        .is_ok_and(|m| m.is_file())
}

/// The traces under `root` (`root` itself if it is one), in path order.
pub fn find_traces(root: &Path) -> Result<Vec<FoundTrace>> {
    let md = fs::metadata(root).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::Missing(root.to_path_buf()),
        _ => Error::io(root, e),
    })?;
    if !md.is_dir() {
        return Err(Error::NotATrace {
            path: root.to_path_buf(),
            reason: "not a directory".into(),
        });
    }
    let mut out = Vec::new();
    walk(root, &mut out)?;
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<FoundTrace>) -> Result<()> {
    if is_trace(dir) {
        out.push(FoundTrace {
            path: dir.to_path_buf(),
            host: partition(dir, "host"),
            trace: partition(dir, "trace"),
        });
        return Ok(());
    }
    let mut subdirs = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        // file_type() does not follow links.
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && !hidden {
            subdirs.push(entry.path());
        }
    }
    subdirs.sort();
    for d in subdirs {
        walk(&d, out)?;
    }
    Ok(())
}

/// The value of the innermost `NAME=value` component of `path`,
/// percent-decoded as Hive and Spark escape it.
pub fn partition(path: &Path, name: &str) -> Option<String> {
    path.components().rev().find_map(|c| {
        let c = c.as_os_str().to_str()?;
        let v = c.strip_prefix(name)?.strip_prefix('=')?;
        Some(percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_come_from_the_nearest_component() {
        let p = Path::new("/data/host=a/x/host=b%2Fc/trace=7");
        assert_eq!(partition(p, "host").as_deref(), Some("b/c"));
        assert_eq!(partition(p, "trace").as_deref(), Some("7"));
        assert_eq!(partition(p, "pid"), None);
        assert_eq!(partition(Path::new("/hostname=x"), "host"), None);
    }

    #[test]
    fn walks_to_traces_and_not_into_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for p in [
            "host=b/trace=1",
            "host=a/trace=2",
            "host=a/trace=1",
            "loose",
        ] {
            fs::create_dir_all(root.join(p)).unwrap();
            fs::write(root.join(p).join("meta.json"), "{}").unwrap();
        }
        // Inside a trace, and hidden: not looked at.
        fs::create_dir_all(root.join("loose/inner")).unwrap();
        fs::write(root.join("loose/inner/meta.json"), "{}").unwrap();
        fs::create_dir_all(root.join(".hidden/t")).unwrap();
        fs::write(root.join(".hidden/t/meta.json"), "{}").unwrap();
        fs::create_dir_all(root.join("empty")).unwrap();
        let found = find_traces(root).unwrap();
        let rel: Vec<String> = found
            .iter()
            .map(|f| f.path.strip_prefix(root).unwrap().display().to_string())
            .collect();
        assert_eq!(
            rel,
            [
                "host=a/trace=1",
                "host=a/trace=2",
                "host=b/trace=1",
                "loose"
            ]
        );
        assert_eq!(found[2].host.as_deref(), Some("b"));
        assert_eq!(found[2].trace.as_deref(), Some("1"));
        assert_eq!(found[3].host, None);
        assert_eq!(find_traces(&root.join("loose")).unwrap().len(), 1);
        assert!(find_traces(&root.join("nothing")).is_err());
    }
}
