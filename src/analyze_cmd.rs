//! `memleak analyze`.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `memleak analyze`.
#[derive(clap::Args)]
pub struct AnalyzeArgs {
    /// Trace directory written by `memleak record`.
    pub trace: PathBuf,
}

pub fn run(args: AnalyzeArgs) -> anyhow::Result<ExitCode> {
    let trace = memleak_trace::Trace::open(&args.trace)?;
    println!("{} events", trace.event_count());
    Ok(ExitCode::SUCCESS)
}
