#![allow(dead_code)]
pub mod elfsyms;
pub mod fixtures;
pub mod procs;
pub mod skip;

pub use skip::skip;

/// Whether this process can load BPF programs (root). If not, says why
/// the calling test is skipped ([`skip`]); it then returns.
pub fn can_record() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip("recording needs root (or CAP_BPF and CAP_PERFMON)");
    false
}

/// The one line a failed memleak command printed, `memleak: error: ...`
/// (libbpf's own lines aside), after checking that it failed and printed
/// nothing else.
pub fn one_line_error(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "expected failure, got {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("libbpf:")).collect();
    assert_eq!(lines.len(), 1, "want one error line, got: {err}");
    assert!(lines[0].starts_with("memleak: error: "), "{err}");
    lines[0].to_string()
}

/// Whether `tool` runs. If not, says why the calling test is skipped
/// ([`skip`]).
pub fn has_tool(tool: &str) -> bool {
    let runs = std::process::Command::new(tool)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok();
    if !runs {
        skip(format_args!("{tool} is not installed"));
    }
    runs
}

/// A tmpfs mounted with `options` (e.g. `size=64k`, `ro,size=64k`) on a
/// temporary directory for one test, unmounted when dropped.
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    /// Mounts one; `None` (having said why the calling test is skipped,
    /// [`skip`]) if this process may not mount.
    pub fn mount(options: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            skip(format_args!("mounting a tmpfs ({options}) needs root"));
            return None;
        }
        Some(Tmpfs(dir))
    }

    /// A read-only file system (an empty tmpfs mounted `ro`).
    pub fn read_only() -> Option<Tmpfs> {
        Tmpfs::mount("ro,size=64k")
    }

    pub fn path(&self) -> &std::path::Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

/// Copies a program or library that a test then runs, with `cp`: the
/// copy's descriptor, open for writing, is then in `cp` alone. Copied
/// here, a child another test forks meanwhile would hold it until its
/// exec, and running the copy would fail with ETXTBSY ("Text file busy").
pub fn copy_executable(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("cp")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success(), "cp {} {}", from.display(), to.display());
}
