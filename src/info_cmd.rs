//! `memleak info`.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `memleak info`.
#[derive(clap::Args)]
pub struct InfoArgs {
    /// Trace directory written by `memleak record`.
    pub trace: PathBuf,
}

pub fn run(args: InfoArgs) -> anyhow::Result<ExitCode> {
    let trace = memleak_trace::Trace::open(&args.trace)?;
    for w in trace.warnings() {
        eprintln!("memleak: warning: {w}");
    }
    println!("{}", serde_json::to_string_pretty(trace.meta())?);
    println!("events: {}", trace.event_count());
    Ok(ExitCode::SUCCESS)
}
