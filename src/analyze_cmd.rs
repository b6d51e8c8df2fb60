//! `memleak analyze`: replay a trace and report outstanding allocations.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::units::{format_duration, parse_duration_ns, parse_size};
use anyhow::{bail, Context};
use clap::ValueEnum;
use memleak_analyze::progress::Progress;
use memleak_analyze::{
    analyze_trace, folded, json, suppress, svg, text, AnalyzeOptions, Filter, KindScope, SortKey,
    Suppression, VerdictSet, Weight,
};

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Top stacks, age histograms and a summary.
    Text,
    /// The report as JSON (docs/json.md).
    Json,
    /// Folded stacks for flamegraph tools.
    Folded,
    /// A flamegraph SVG.
    Svg,
    /// All four, into the directory given with -o.
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

/// Event scopes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// User-space allocators.
    User,
    /// Kernel allocators.
    Kernel,
    /// Heap allocator calls of processes, without mmap: what valgrind
    /// counts.
    Heap,
    /// Memory mappings of processes (mmap, munmap, mremap).
    Mmap,
    /// Both.
    All,
}

/// Arguments of `memleak analyze`.
#[derive(clap::Args)]
pub struct AnalyzeArgs {
    /// Trace directory written by `memleak record`.
    pub trace: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Write to this file instead of stdout (a directory for --format all).
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Number of stacks shown in text and JSON (0: all).
    #[arg(short = 'T', long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Order of the stacks.
    #[arg(long, value_enum, default_value = "bytes")]
    pub sort: SortArg,
    /// What flamegraph widths measure (folded and svg).
    #[arg(long, value_enum, default_value = "bytes")]
    pub weight: WeightArg,
    /// Evaluate the state and ages at this time since the recording
    /// started (e.g. 30s, 1.5m; a bare number is seconds) instead of at
    /// its end; at most the recording's length.
    #[arg(long, value_name = "TIME", value_parser = parse_duration_ns)]
    pub at: Option<u64>,
    /// Only these processes (repeat or separate with commas).
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Only outstanding allocations at least this old (e.g. 5s, 500ms).
    #[arg(long, value_name = "AGE", value_parser = parse_duration_ns)]
    pub older_than: Option<u64>,
    /// Only allocations of at least this size (bytes; k, M, G suffixes,
    /// binary: 1k = 1024).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub min_size: Option<u64>,
    /// Only allocations of at most this size (bytes; k, M, G suffixes;
    /// at least --min-size).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// Only allocations made at or after this time since the start.
    #[arg(long, value_name = "TIME", value_parser = parse_duration_ns)]
    pub from: Option<u64>,
    /// Only allocations made before this time since the start (after
    /// --from).
    #[arg(long, value_name = "TIME", value_parser = parse_duration_ns)]
    pub to: Option<u64>,
    /// User-space allocations, kernel ones, or both.
    #[arg(long, value_enum, default_value = "all")]
    pub kind: KindArg,
    /// Only blocks of these scan verdicts, comma-separated: definitely,
    /// indirectly, possibly, reachable, unscanned, or lost (the first
    /// three). Needs a trace with a scan.
    #[arg(long, value_name = "LIST", value_parser = parse_verdicts)]
    pub verdict: Option<VerdictSet>,
    /// Leave out the stacks a suppression file matches and count them
    /// apart (repeatable; syntax in docs/analyzer.md).
    #[arg(long, value_name = "FILE")]
    pub suppress: Vec<PathBuf>,
    /// Do not apply the built-in suppressions of runtime holders (the
    /// libstdc++ emergency pool, glibc's thread stacks, ld.so).
    #[arg(long)]
    pub no_default_suppressions: bool,
    /// Worker threads, at least 1 (default: one per core).
    #[arg(short = 'j', long, value_name = "N", value_parser = parse_jobs)]
    pub jobs: Option<usize>,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

fn parse_verdicts(text: &str) -> Result<VerdictSet, String> {
    VerdictSet::parse(text)
}

/// The default suppressions (unless turned off), then each file's.
fn load_suppressions(args: &AnalyzeArgs) -> anyhow::Result<Vec<Suppression>> {
    let mut out = Vec::new();
    if !args.no_default_suppressions {
        out.extend(
            suppress::parse(suppress::DEFAULT_SUPPRESSIONS, "default suppressions")
                .map_err(anyhow::Error::msg)?,
        );
    }
    for path in &args.suppress {
        let text = fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        let origin = path.display().to_string();
        out.extend(suppress::parse(&text, &origin).map_err(anyhow::Error::msg)?);
    }
    Ok(out)
}

fn parse_jobs(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("at least 1 worker thread is needed".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

pub fn run(args: AnalyzeArgs) -> anyhow::Result<ExitCode> {
    crate::keep_freed_memory();
    if let Some(j) = args.jobs {
        // Only fails if the pool was already built, which cannot happen here.
        let _ = rayon_pool(j);
    }
    if args.format == Format::All && args.output.is_none() {
        bail!("--format all writes four files: give a directory with -o");
    }
    if let (Some(a), Some(b)) = (args.min_size, args.max_size) {
        if a > b {
            bail!("--min-size ({a}) is larger than --max-size ({b})");
        }
    }
    if let (Some(from), Some(to)) = (args.from, args.to) {
        if from >= to {
            bail!(
                "--from ({}) is not before --to ({}): no allocation can match",
                format_duration(Duration::from_nanos(from)),
                format_duration(Duration::from_nanos(to))
            );
        }
    }
    let trace = memleak_trace::Trace::open(&args.trace)?;
    if let (Some(at), Some(length)) = (args.at, recording_length(&trace)?) {
        if at > length {
            bail!(
                "--at {} is past the end of the recording, which is {:.3}s long",
                format_duration(Duration::from_nanos(at)),
                length as f64 / 1e9
            );
        }
    }
    for w in trace.warnings() {
        say!("memleak: warning: {w}");
    }
    let suppressions = load_suppressions(&args)?;
    if let Some(v) = args.verdict {
        let scans = &trace.meta().scans;
        let ok: Vec<_> = scans.iter().filter(|s| s.error.is_none()).collect();
        if ok.is_empty() {
            bail!(
                "--verdict {}: {} has no scan to take verdicts from (record with a scan: \
                 at exit in -- CMD mode, --scan with -p, or memleak scan)",
                v.describe(),
                args.trace.display()
            );
        }
        if let Some(at) = args.at {
            let start = trace.meta().start_ns;
            let first = ok.iter().map(|s| s.ts_ns).min().unwrap_or(0);
            if start.saturating_add(at) < first {
                bail!(
                    "--verdict with --at {}: the first scan is at {}, after it; verdicts apply \
                     from the time of a scan",
                    format_duration(Duration::from_nanos(at)),
                    format_duration(Duration::from_nanos(first.saturating_sub(start)))
                );
            }
        }
    }
    let opts = AnalyzeOptions {
        filter: Filter {
            pids: args.pids.clone(),
            kind: match args.kind {
                KindArg::User => KindScope::User,
                KindArg::Kernel => KindScope::Kernel,
                KindArg::Heap => KindScope::Heap,
                KindArg::Mmap => KindScope::Mmap,
                KindArg::All => KindScope::All,
            },
            min_size: args.min_size,
            max_size: args.max_size,
            from_ns: args.from,
            to_ns: args.to,
            older_than_ns: args.older_than,
        },
        at_ns: args.at,
        top: args.top,
        sort: match args.sort {
            SortArg::Bytes => SortKey::Bytes,
            SortArg::Count => SortKey::Count,
            SortArg::Age => SortKey::Age,
        },
        partitions: 0,
        verdicts: args.verdict.unwrap_or_default(),
        suppressions,
    };
    let weight = match args.weight {
        WeightArg::Bytes => Weight::Bytes,
        WeightArg::Count => Weight::Count,
        WeightArg::AllocatedBytes => Weight::AllocatedBytes,
        WeightArg::Allocations => Weight::Allocations,
    };
    let progress = Progress::new(trace.event_count(), args.quiet);
    let advance = |rows: u64| progress.advance(rows);
    let report = analyze_trace(&trace, &opts, Some(&advance));
    progress.finish();
    let report = report?;

    match args.format {
        Format::Text => emit(args.output.as_deref(), text::render(&report).as_bytes())?,
        Format::Json => emit_with(args.output.as_deref(), |w| json::write(&report, w))?,
        Format::Folded => emit(
            args.output.as_deref(),
            folded::render(&report, weight).as_bytes(),
        )?,
        Format::Svg => {
            let svg = svg::render(&report, weight).context("drawing the flamegraph")?;
            emit(args.output.as_deref(), &svg)?
        }
        Format::All => {
            let dir = args.output.as_deref().expect("checked above");
            fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
            emit(
                Some(&dir.join("report.txt")),
                text::render(&report).as_bytes(),
            )?;
            emit_with(Some(&dir.join("report.json")), |w| json::write(&report, w))?;
            emit(
                Some(&dir.join("stacks.folded")),
                folded::render(&report, weight).as_bytes(),
            )?;
            let svg = svg::render(&report, weight).context("drawing the flamegraph")?;
            emit(Some(&dir.join("flamegraph.svg")), &svg)?;
            say!(
                "memleak: wrote report.txt, report.json, stacks.folded, flamegraph.svg to {}",
                dir.display()
            );
        }
    }
    // The process ends here: the operating system takes the report's
    // memory back at once, where freeing its many strings one by one took
    // milliseconds after the output was complete.
    std::mem::forget(report);
    Ok(ExitCode::SUCCESS)
}

/// How long the recording ran, in nanoseconds: from the meta's start to
/// its end, or to the last event of a trace that was never finished (its
/// end is 0). None if that is unknown.
fn recording_length(trace: &memleak_trace::Trace) -> anyhow::Result<Option<u64>> {
    let meta = trace.meta();
    if meta.start_ns == 0 {
        return Ok(None);
    }
    let end = if meta.end_ns != 0 {
        meta.end_ns
    } else {
        // Rows are in time order: the last row group ends the recording.
        match trace.event_units().last() {
            Some(unit) => {
                let batch = trace.read_unit(unit, memleak_trace::EventColumns::TS)?;
                batch.ts_ns.iter().copied().max().unwrap_or(0)
            }
            None => return Ok(None),
        }
    };
    Ok((end > meta.start_ns).then(|| end - meta.start_ns))
}

fn rayon_pool(threads: usize) -> Result<(), String> {
    memleak_analyze::replay::set_threads(threads)
}

fn emit(path: Option<&Path>, bytes: &[u8]) -> anyhow::Result<()> {
    emit_with(path, |w| w.write_all(bytes))
}

/// Like [`emit`], for output written piece by piece as it is made.
fn emit_with(
    path: Option<&Path>,
    write: impl FnOnce(&mut (dyn Write + Send)) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    match path {
        Some(p) => fs::File::create(p)
            .and_then(|f| {
                let mut f = std::io::BufWriter::with_capacity(1 << 20, f);
                write(&mut f)?;
                f.flush()
            })
            .with_context(|| format!("{}", p.display())),
        // A closed pipe (`| head`) ends us quietly; a full disk is an error.
        None => crate::output::to_stdout(write),
    }
}
