//! `memleak analyze A B C…` and `memleak analyze ROOT`: many traces, one
//! report, their stacks merged by symbolized frames, with a breakdown by
//! trace, host or command (the merging is `memleak_analyze::fleet`).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use memleak_analyze::fleet::{self, FleetOptions, GroupBy, TraceSource};
use memleak_analyze::progress::Progress;
use memleak_analyze::{AnalyzeOptions, Report};
use memleak_trace::{find_traces, is_trace, Trace};

use crate::select_args::SelectArgs;

/// The traces of a multi-trace run, or `None` for the single-trace
/// report: one path, a trace (or not a directory, or a directory without
/// any trace under it, which the single-trace path explains), and no
/// `--group-by`.
pub fn sources(paths: &[PathBuf], grouped: bool) -> anyhow::Result<Option<Vec<TraceSource>>> {
    let single = |p: &Path| is_trace(p) || !p.is_dir();
    if let ([one], false) = (paths, grouped) {
        if single(one) || find_traces(one).map_or(true, |f| f.is_empty()) {
            return Ok(None);
        }
    }
    let mut out = Vec::new();
    for path in paths {
        let found = find_traces(path)?;
        if found.is_empty() {
            bail!(
                "{}: no trace under it (a trace is a directory holding meta.json)",
                path.display()
            );
        }
        out.extend(found.into_iter().map(TraceSource::from));
    }
    Ok(Some(out))
}

/// What a multi-trace run is given.
pub struct FleetRun<'a> {
    /// The paths given (for the report's label).
    pub paths: &'a [PathBuf],
    /// The traces found under them.
    pub sources: Vec<TraceSource>,
    /// Filters, `--at`, workers.
    pub select: &'a SelectArgs,
    /// The analysis options every trace is analyzed with.
    pub analyze: AnalyzeOptions,
    /// How the breakdown is grouped.
    pub group_by: GroupBy,
}

/// Analyzes the traces of `run` into one report and writes it with
/// `write`, which is given the pprof context that fits a merged report.
pub fn run(
    run: FleetRun<'_>,
    write: impl FnOnce(Report, memleak_analyze::pprof::Context) -> anyhow::Result<()>,
) -> anyhow::Result<ExitCode> {
    let FleetRun {
        paths,
        sources,
        select,
        analyze,
        group_by,
    } = run;
    if !select.pids.is_empty() {
        bail!("--pid names processes of one recording: not with several traces");
    }
    let opts = FleetOptions {
        analyze,
        group_by,
        label: fleet::label(&paths.iter().map(|p| p.as_path()).collect::<Vec<_>>()),
        ..Default::default()
    };
    let sources = &sources;
    // The bar's total is read from each meta.json, and only for a bar.
    let shown = !select.quiet && std::io::stderr().is_terminal();
    let total = if shown {
        sources
            .iter()
            .filter_map(|s| memleak_trace::Meta::load(&s.path).ok())
            .map(|m| m.counters.events_total())
            .sum()
    } else {
        0
    };
    let progress = Progress::new(total, select.quiet);
    let advance = |rows: u64| progress.advance(rows);
    let open = |s: &TraceSource| -> anyhow::Result<Trace> {
        // Replay checks the events files' checksums as it reads them.
        let trace = Trace::open_deferred(&s.path)?;
        select
            .check_trace(&trace)
            .with_context(|| s.path.display().to_string())?;
        for w in trace.warnings() {
            say!("memleak: warning: {w}");
        }
        Ok(trace)
    };
    let report = fleet::analyze_traces(sources, &opts, open, Some(&advance));
    progress.finish();
    let report = report?;
    let fleet = report
        .fleet
        .clone()
        .expect("a multi-trace report has a fleet");
    // The maps of one trace cannot place the frames of another: the
    // profile's mappings are made from the frames.
    write(report, memleak_analyze::pprof::Context::default())?;
    // After the report, where it is the last thing on the terminal.
    let mut uncertain = false;
    for t in &fleet.traces {
        let losses = t.losses();
        if let Some(note) = losses.stack_note() {
            say!("memleak: note: {}: {note}", t.path);
        }
        if let Some(w) = losses.warning() {
            say!("memleak: warning: {}: {w}", t.path);
        }
        uncertain |= losses.uncertain();
    }
    Ok(select.exit_status(uncertain))
}
