//! `memleak diff BASE NEW`: replay two traces with the same options and
//! compare their outstanding allocations stack by stack (matching and
//! rendering live in `memleak_analyze::diff`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;
use memleak_analyze::diff::{self, DiffWeight, Keyed, MatchOptions};
use memleak_analyze::progress::Progress;
use memleak_analyze::{analyze_trace, Render, SortKey};

use crate::output::{emit, emit_bytes};
use crate::select_args::{warn_of_losses, SelectArgs};

/// Output formats of the diff.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    /// Grown and shrunk stacks and a summary.
    Text,
    /// The diff as JSON (fields described in memleak's JSON report
    /// documentation).
    Json,
    /// Two-column folded stacks (`path base new`) for differential
    /// flamegraphs.
    Folded,
    /// A differential flamegraph SVG.
    Svg,
}

/// Differential flamegraph weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffWeightArg {
    /// Outstanding bytes.
    Bytes,
    /// Outstanding allocations.
    Count,
}

/// Arguments of `memleak diff`.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  memleak diff before.parquet after.parquet                 # did the fix work? grown stacks first
  memleak diff before.parquet after.parquet --ignore-lines  # code moved between the builds
  memleak diff base.parquet new.parquet --base-pid 10 --new-pid 20
  memleak diff before.parquet after.parquet --format svg -o diff.svg")]
pub struct DiffArgs {
    /// The trace before (e.g. without the fix).
    pub base: PathBuf,
    /// The trace after.
    pub new: PathBuf,
    /// Output format.
    #[arg(help_heading = crate::analyze_cmd::OUTPUT, long, value_enum, default_value = "text")]
    pub format: DiffFormat,
    /// Write to this file instead of stdout.
    #[arg(help_heading = crate::analyze_cmd::OUTPUT, short = 'o', long = "output", value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Stacks shown in text and JSON of each change: grown, shrunk,
    /// unchanged (0: all).
    #[arg(help_heading = crate::analyze_cmd::OUTPUT, short = 'T', long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// What flamegraph widths measure (folded and svg).
    #[arg(help_heading = crate::analyze_cmd::OUTPUT, long, value_enum, default_value = "bytes")]
    pub weight: DiffWeightArg,
    /// Draw the flamegraph with BASE's widths rather than NEW's, so that
    /// what NEW no longer holds shows (colors still say NEW - BASE).
    #[arg(help_heading = crate::analyze_cmd::OUTPUT, long)]
    pub base_widths: bool,
    /// Match frames by function and source file only, not line: for
    /// builds whose code moved.
    #[arg(help_heading = "Matching stacks and processes", long)]
    pub ignore_lines: bool,
    /// Only these processes of BASE (repeat or separate with commas);
    /// replaces --pid for BASE.
    #[arg(
        help_heading = "Matching stacks and processes",
        long,
        value_name = "PID",
        value_delimiter = ','
    )]
    pub base_pid: Vec<u32>,
    /// Only these processes of NEW; replaces --pid for NEW.
    #[arg(
        help_heading = "Matching stacks and processes",
        long,
        value_name = "PID",
        value_delimiter = ','
    )]
    pub new_pid: Vec<u32>,
    /// Filters (applied to both traces), `--at`, workers.
    #[command(flatten)]
    pub select: SelectArgs,
}

pub fn run(args: DiffArgs) -> anyhow::Result<ExitCode> {
    args.select.check()?;
    let open = |which: &str, path: &Path| -> anyhow::Result<memleak_trace::Trace> {
        // Replay checks the events files' checksums as it reads them.
        let trace =
            memleak_trace::Trace::open_deferred(path).with_context(|| format!("{which} trace"))?;
        args.select
            .check_trace(&trace)
            .with_context(|| format!("{which} trace {}", path.display()))?;
        for w in trace.warnings() {
            say!("memleak: warning: {which} trace: {w}");
        }
        Ok(trace)
    };
    let base = open("base", &args.base)?;
    let new = open("new", &args.new)?;
    // A process id names a process of one recording only: --pid applies
    // to both traces unless a side has its own.
    let pids = |own: &[u32]| {
        if own.is_empty() {
            args.select.pids.clone()
        } else {
            own.to_vec()
        }
    };
    let progress = Progress::new(base.event_count() + new.event_count(), args.select.quiet);
    let advance = |rows: u64| progress.advance(rows);
    let opts = MatchOptions {
        ignore_lines: args.ignore_lines,
    };
    // Keyed without lines too, unless they are ignored already: to tell
    // whether code that moved made every stack read as gone and new.
    let loose = MatchOptions { ignore_lines: true };
    type Keys = (Keyed, Option<Keyed>);
    let analyze = |trace: &memleak_trace::Trace, pids: Vec<u32>| -> anyhow::Result<Keys> {
        // Every stack: the diff shows its own top.
        let aopts = args.select.options(pids, 0, SortKey::Bytes)?;
        let report = analyze_trace(trace, &aopts, Some(&advance))?;
        let keyed = Keyed::new(&report, opts);
        let keyed_loose = (!opts.ignore_lines).then(|| Keyed::new(&report, loose));
        // The replay's tables go before the next replay builds its own.
        drop(report);
        Ok((keyed, keyed_loose))
    };
    let keyed = analyze(&base, pids(&args.base_pid)).and_then(|b| {
        let n = analyze(&new, pids(&args.new_pid))?;
        Ok((b, n))
    });
    progress.finish();
    let ((base_keyed, base_loose), (new_keyed, new_loose)) = keyed?;
    let mut d = diff::diff_keyed(base_keyed, new_keyed, args.top);
    let hint = match (base_loose, new_loose) {
        (Some(b), Some(n)) => diff::moved_lines_hint(&d, &diff::diff_keyed(b, n, 0)),
        _ => None,
    };
    let side_filters = |name: &str, own: &[u32]| {
        (!own.is_empty()).then(|| {
            let p: Vec<String> = own.iter().map(|p| p.to_string()).collect();
            format!("{name}={}", p.join(","))
        })
    };
    // The reports name the pids each side was analyzed with; the diff
    // says which option selected them.
    d.summary.filters.retain(|f| !f.starts_with("pid="));
    d.summary
        .filters
        .extend(side_filters("pid", &args.select.pids));
    d.summary
        .filters
        .extend(side_filters("base-pid", &args.base_pid));
    d.summary
        .filters
        .extend(side_filters("new-pid", &args.new_pid));
    let weight = match args.weight {
        DiffWeightArg::Bytes => DiffWeight::Bytes,
        DiffWeightArg::Count => DiffWeight::Count,
    };
    let out = args.output.as_deref();
    match args.format {
        DiffFormat::Text => emit(out, &diff::text::Text, &d)?,
        DiffFormat::Json => emit(out, &diff::json::Json, &d)?,
        DiffFormat::Folded => emit(out, &diff::folded::Folded(weight), &d)?,
        DiffFormat::Svg => {
            let svg = diff::svg::Svg {
                weight,
                base_widths: args.base_widths,
            };
            // Drawn in memory first, so that its failure says so.
            let svg = svg.render(&d).context("drawing the flamegraph")?;
            emit_bytes(out, &svg)?
        }
    }
    // As for analyze: the process ends here, no need to free the reports.
    std::mem::forget(d);
    if let Some(h) = hint {
        say!("memleak: hint: {h}");
    }
    let base_uncertain = warn_of_losses(&base, Some("base"));
    let new_uncertain = warn_of_losses(&new, Some("new"));
    Ok(args.select.exit_status(base_uncertain || new_uncertain))
}
