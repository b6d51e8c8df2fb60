//! `record --dataset ROOT`: each recording gets its own trace directory
//! at `ROOT/host=H/trace=ID/`, the Hive layout that one glob over a fleet
//! reads (`memleak analyze ROOT`, `memleak sql ROOT`, DuckDB, Spark).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

/// The trace directory of a new recording under `root` on `host`:
/// `trace=` the UTC start time and memleak's pid, so two recordings never
/// share one. Creates `root/host=H/` (mode 0700, as traces are) if needed;
/// the trace directory itself is the writer's to create.
pub(super) fn trace_dir(root: &Path, host: &str) -> Result<PathBuf> {
    if host.is_empty() || host.contains(['/', '=']) || host.starts_with('.') {
        bail!("--dataset: host name {host:?} cannot name a host= directory");
    }
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let id = format!("{}-{}", utc_stamp(secs), std::process::id());
    let host_dir = root.join(format!("host={host}"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&host_dir)
        .with_context(|| format!("--dataset: cannot create {}", host_dir.display()))?;
    Ok(host_dir.join(format!("trace={id}")))
}

/// `YYYYMMDDTHHMMSSZ` of a Unix time.
fn utc_stamp(secs: u64) -> String {
    let [year, month, day, h, m, s] = crate::units::utc_fields(secs);
    format!("{year:04}{month:02}{day:02}T{h:02}{m:02}{s:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_calendar_times() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_795_818_245), "20261127T222405Z");
    }

    #[test]
    fn one_directory_per_recording_under_its_host() {
        let root = tempfile::tempdir().unwrap();
        let dir = trace_dir(root.path(), "web-7").unwrap();
        assert_eq!(dir.parent().unwrap(), root.path().join("host=web-7"));
        assert!(root.path().join("host=web-7").is_dir());
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("trace=") && name.ends_with(&format!("-{}", std::process::id())));
        assert!(!dir.exists(), "the writer creates the trace itself");
        assert!(trace_dir(root.path(), "a/b").is_err());
    }
}
