//! `memleak analyze`: replay a trace and report outstanding allocations.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::select_args::SelectArgs;
use crate::units::parse_positive_duration;
use anyhow::{bail, Context};
use clap::ValueEnum;
use memleak_analyze::progress::Progress;
use memleak_analyze::report::{Folded, Html, Json, Pprof, Svg, Text};
use memleak_analyze::{analyze_trace, pprof, Render, SortKey, Weight};

use crate::analyze_fleet::{self, FleetRun};
use crate::output::{emit, emit_bytes};
use memleak_analyze::fleet::GroupBy;

/// The help's heading of the options that say what a report shows and how.
pub const OUTPUT: &str = "Output";

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Top stacks, age histograms and a summary.
    Text,
    /// The report as JSON (fields described in memleak's JSON report
    /// documentation).
    Json,
    /// Folded stacks for flamegraph tools.
    Folded,
    /// A flamegraph SVG.
    Svg,
    /// A gzipped pprof profile (`go tool pprof`), every stack: binary,
    /// so never to a terminal.
    Pprof,
    /// One self-contained HTML page: summary, timeline, flamegraphs, top
    /// stacks.
    Html,
    /// All of the above, into the directory given with -o.
    All,
}

/// Sort orders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SortArg {
    /// Most outstanding bytes first.
    Bytes,
    /// Most outstanding allocations first.
    Count,
    /// Oldest outstanding allocation first.
    Age,
    /// Growing stacks first (steepest first), then plateaus, unknown, and
    /// stacks that freed their memory late (transient, listed too).
    Growth,
    /// Most temporary allocations first (stacks with nothing
    /// outstanding too).
    Temporary,
    /// Worst scan verdict first (definitely lost, indirectly, possibly,
    /// reachable, unscanned), then bytes: --group-by verdict --sort bytes.
    Verdict,
}

/// Flamegraph weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WeightArg {
    /// Outstanding bytes.
    Bytes,
    /// Outstanding allocations.
    Count,
    /// Bytes allocated during the trace, freed or not.
    AllocatedBytes,
    /// Allocations made during the trace, freed or not.
    Allocations,
}

/// What `--group-by` groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GroupByArg {
    /// The stacks, by worst scan verdict, definitely lost first, each
    /// group in the --sort order. Needs a trace with a scan.
    Verdict,
    /// The per-trace breakdown of a report of several traces, by host.
    Host,
    /// The per-trace breakdown, one row per trace.
    Trace,
    /// The per-trace breakdown, by traced command.
    Command,
}

impl GroupByArg {
    /// The grouping of a multi-trace report's breakdown this asks for
    /// (`None`: a grouping of something else).
    fn breakdown(self) -> Option<GroupBy> {
        match self {
            GroupByArg::Verdict => None,
            GroupByArg::Host => Some(GroupBy::Host),
            GroupByArg::Trace => Some(GroupBy::Trace),
            GroupByArg::Command => Some(GroupBy::Command),
        }
    }
}

/// Arguments of `memleak analyze`.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  memleak analyze trace.parquet                       # top 10 stacks by outstanding bytes
  memleak analyze trace.parquet --older-than 5s -T 0  # every stack holding blocks 5 s old
  memleak analyze trace.parquet --verdict definitely --group-by verdict
  memleak analyze trace.parquet --at peak --sort growth
  memleak analyze trace.parquet --format html -o report.html")]
pub struct AnalyzeArgs {
    /// Trace directories written by `memleak record`, or dataset roots
    /// holding traces (`ROOT/host=H/trace=ID/`): several traces make one
    /// report, their stacks merged by symbolized frames.
    #[arg(required = true, value_name = "TRACE|ROOT")]
    pub traces: Vec<PathBuf>,
    /// Output format.
    #[arg(help_heading = OUTPUT, long, value_enum, default_value = "text")]
    pub format: Format,
    /// Write to this file instead of stdout (a directory for --format all).
    #[arg(help_heading = OUTPUT, short = 'o', long = "output", value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Number of stacks shown in text and JSON (0: all).
    #[arg(help_heading = OUTPUT, short = 'T', long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Order of the stacks.
    #[arg(help_heading = OUTPUT, long, value_enum, default_value = "bytes")]
    pub sort: SortArg,
    /// `verdict`: group the stacks by verdict before --sort orders each
    /// group. `host`, `trace`, `command`: the grouping of the per-trace
    /// breakdown of a report of several traces (default: trace); with one
    /// trace, makes that report of it.
    #[arg(help_heading = OUTPUT, long, value_enum, value_name = "GROUP")]
    pub group_by: Option<GroupByArg>,
    /// What flamegraph widths measure (folded and svg).
    #[arg(help_heading = OUTPUT, long, value_enum, default_value = "bytes")]
    pub weight: WeightArg,
    /// Filters, `--at`, workers.
    #[command(flatten)]
    pub select: SelectArgs,
    /// An allocation freed within this time by the thread that made it,
    /// before the thread allocated again, counts as temporary.
    #[arg(long, value_name = "TIME", default_value = "1ms", value_parser = parse_positive_duration,
          help_heading = OUTPUT)]
    pub temporary_threshold: Duration,
}

pub fn run(args: AnalyzeArgs) -> anyhow::Result<ExitCode> {
    if args.format == Format::All && args.output.is_none() {
        bail!("--format all writes six files: give a directory with -o");
    }
    if args.format == Format::Pprof
        && args.output.is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stdout())
    {
        bail!("--format pprof writes a binary file: give one with -o, or redirect stdout");
    }
    args.select.check()?;
    let breakdown = args.group_by.and_then(GroupByArg::breakdown);
    if let Some(sources) = analyze_fleet::sources(&args.traces, breakdown.is_some())? {
        let run = FleetRun {
            paths: &args.traces,
            sources,
            select: &args.select,
            analyze: options(&args)?,
            group_by: breakdown.unwrap_or_default(),
        };
        return analyze_fleet::run(run, |report, context| {
            write_report(&args, report, || Ok(context.clone()))
        });
    }
    // Replay checks the events files' checksums as it reads them.
    let trace = memleak_trace::Trace::open_deferred(&args.traces[0])?;
    args.select.check_trace(&trace)?;
    check_verdict_order(&args, &trace)?;
    for w in trace.warnings() {
        say!("memleak: warning: {w}");
    }
    let opts = options(&args)?;
    let progress = Progress::new(trace.event_count(), args.select.quiet);
    let advance = |rows: u64| progress.advance(rows);
    let report = analyze_trace(&trace, &opts, Some(&advance));
    progress.finish();
    let report = report?;
    let pprof_context = || pprof::Context::read(&trace).context("reading the maps table");
    write_report(&args, report, pprof_context)?;
    // After the report, where it is the last thing on the terminal.
    let uncertain = crate::select_args::warn_of_losses(&trace, None);
    Ok(args.select.exit_status(uncertain))
}

/// `--sort verdict` and `--group-by verdict` need a trace with a scan.
fn check_verdict_order(args: &AnalyzeArgs, trace: &memleak_trace::Trace) -> anyhow::Result<()> {
    let group_by_verdict = args.group_by == Some(GroupByArg::Verdict);
    if (group_by_verdict || args.sort == SortArg::Verdict)
        && trace.meta().scans.iter().all(|s| s.error.is_some())
    {
        let what = if group_by_verdict {
            "--group-by verdict"
        } else {
            "--sort verdict"
        };
        if trace.meta().sampling.is_some() {
            bail!(
                "{what}: {} is a sampled recording (--sample): a pointer held in an unsampled \
                 block cannot be followed, so it has no verdicts",
                trace.path().display()
            );
        }
        bail!(
            "{what}: {} has no scan to take verdicts from (record with a scan: at exit in -- CMD \
             mode, or --scan with -p)",
            trace.path().display()
        );
    }
    Ok(())
}

/// The analysis options of `args`, for every process.
fn options(args: &AnalyzeArgs) -> anyhow::Result<memleak_analyze::AnalyzeOptions> {
    let sort = match args.sort {
        SortArg::Bytes => SortKey::Bytes,
        SortArg::Count => SortKey::Count,
        SortArg::Age => SortKey::Age,
        SortArg::Growth => SortKey::Growth,
        SortArg::Temporary => SortKey::Temporary,
        SortArg::Verdict => SortKey::Verdict,
    };
    let group_by_verdict = args.group_by == Some(GroupByArg::Verdict);
    let mut opts = args
        .select
        .options(args.select.pids.clone(), args.top, sort)?;
    opts.group_by_verdict = group_by_verdict;
    opts.temporary_threshold_ns =
        Some(args.temporary_threshold.as_nanos().min(u64::MAX as u128) as u64);
    Ok(opts)
}

/// Writes `report` in the format `args` ask for; `pprof_context` reads
/// what the pprof profile needs beyond the report.
fn write_report(
    args: &AnalyzeArgs,
    report: memleak_analyze::Report,
    pprof_context: impl Fn() -> anyhow::Result<pprof::Context>,
) -> anyhow::Result<()> {
    let weight = match args.weight {
        WeightArg::Bytes => Weight::Bytes,
        WeightArg::Count => Weight::Count,
        WeightArg::AllocatedBytes => Weight::AllocatedBytes,
        WeightArg::Allocations => Weight::Allocations,
    };
    let out = args.output.as_deref();
    // Folded stacks have no place for a note: the one that every other
    // format carries is said here.
    if let (Format::Folded, Some(s)) = (args.format, report.summary.sampling) {
        say!(
            "memleak: note: a sampled recording (mean {}): the folded stacks' figures are \
             estimates",
            memleak_analyze::format_bytes(s.mean_bytes)
        );
    }
    // A flamegraph is drawn in memory first, so that its failure says so.
    let svg = |report| Svg(weight).render(report).context("drawing the flamegraph");
    match args.format {
        Format::Text => emit(out, &Text, &report)?,
        Format::Json => emit(out, &Json, &report)?,
        Format::Folded => emit(out, &Folded(weight), &report)?,
        Format::Svg => emit_bytes(out, &svg(&report)?)?,
        Format::Pprof => emit(out, &Pprof(pprof_context()?), &report)?,
        Format::Html => emit(out, &Html, &report)?,
        Format::All => {
            let dir = args.output.as_deref().expect("checked above");
            crate::output::report_dir(dir)?;
            let formats: [&dyn Render<_>; 6] = [
                &Text,
                &Json,
                &Folded(weight),
                &Svg(weight),
                &Pprof(pprof_context()?),
                &Html,
            ];
            let svg = svg(&report)?;
            for f in formats {
                let path = dir.join(f.file_name());
                match f.file_name() == Svg(weight).file_name() {
                    true => emit_bytes(Some(&path), &svg)?,
                    false => emit(Some(&path), f, &report)?,
                }
            }
            let names: Vec<&str> = formats.iter().map(|f| f.file_name()).collect();
            say!("memleak: wrote {} to {}", names.join(", "), dir.display());
        }
    }
    // The process ends here: the operating system takes the report's
    // memory back at once, where freeing its many strings one by one took
    // milliseconds after the output was complete.
    std::mem::forget(report);
    Ok(())
}
