//! `memleak`: record allocations of live processes with eBPF, analyze them
//! anywhere.
//!
//! The binary is thin: `record` wires the probes (`record::probes`, the only
//! module that touches libbpf) to the recording pipeline in `memleak-recorder`;
//! `analyze`, `diff` and `info` read traces through `memleak-trace` and
//! `memleak-analyze`, and build without BPF (`--no-default-features`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `eprintln!` that cannot panic: a closed or full stderr (`2>&-`, a
/// reader that went away) must not stop a recording over a message nobody
/// can read.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that cannot panic (see `say!`). Only recording prints
/// partial lines (its live view).
#[cfg(feature = "bpf")]
macro_rules! say_inline {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

mod analyze_cmd;
mod bcc_flags;
mod diff_cmd;
mod exit_status;
mod info_cmd;
mod malloc_tuning;
mod output;
#[cfg(feature = "bpf")]
mod record;
mod select_args;
mod sql_cmd;
mod units;

/// eBPF memory-leak tracer with record and replay.
#[derive(Parser)]
#[command(name = "memleak", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Record allocations of a process (-p PID) or a command (-c / --) into a trace.
    #[cfg(feature = "bpf")]
    Record(record::RecordArgs),
    /// Replay a trace and report outstanding allocations by stack.
    Analyze(analyze_cmd::AnalyzeArgs),
    /// Compare the outstanding allocations of two traces, stack by stack
    /// (matched by symbolized frames, so two builds or hosts compare).
    Diff(diff_cmd::DiffArgs),
    /// Print a trace's metadata, tables and counters.
    Info(info_cmd::InfoArgs),
    /// Print the SQL that computes the outstanding-by-stack report over
    /// traces or a dataset, for DuckDB or Spark (docs/fleet.md).
    Sql(sql_cmd::SqlArgs),
}

/// A command-line error as one `memleak: error:` line, like every other
/// error: clap's message, without the usage and the `--help` hint that
/// follow it.
fn usage_error(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first = text.split("\n\n").next().unwrap_or_default();
    let line = first
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    format!("memleak: error: {line}{}", bcc_hint(e))
}

/// For an option `record` does not take but bcc's memleak does: where it
/// lives here (`bcc_flags`).
fn bcc_hint(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let subcommand = std::env::args().nth(1);
    if e.kind() != ErrorKind::UnknownArgument || subcommand.as_deref() != Some("record") {
        return String::new();
    }
    match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => bcc_flags::record_hint(arg)
            .map(|h| format!("; {h}"))
            .unwrap_or_default(),
        _ => String::new(),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help, --version, and the help shown when no command is given.
        Err(e)
            if !e.use_stderr()
                || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            e.exit()
        }
        Err(e) => {
            say!("{}", usage_error(&e));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        #[cfg(feature = "bpf")]
        Command::Record(args) => record::run(args),
        Command::Analyze(args) => analyze_cmd::run(args),
        Command::Diff(args) => diff_cmd::run(args),
        Command::Info(args) => info_cmd::run(args),
        Command::Sql(args) => sql_cmd::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => output::exit_code(&e),
    }
}
