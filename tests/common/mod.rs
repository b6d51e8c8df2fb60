#![allow(dead_code)]
pub mod elfsyms;
pub mod fixtures;
pub mod procs;

/// Whether this process can load BPF programs (root). If not, prints the
/// one line that says why the calling test is skipped; it then returns.
pub fn can_record() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eprintln!("skipping: recording needs root (or CAP_BPF and CAP_PERFMON)");
    false
}

/// Whether `tool` runs. If not, prints the one line that says why the
/// calling test is skipped.
pub fn has_tool(tool: &str) -> bool {
    let runs = std::process::Command::new(tool)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok();
    if !runs {
        eprintln!("skipping: {tool} is not installed");
    }
    runs
}
