//! Running the analysis of many traces: a few at a time, in parallel,
//! each reduced to its keyed stacks as soon as its report is ready.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use memleak_trace::{Meta, Trace};

use crate::analysis::{analyze_trace_unresolved, AnalyzeOptions};
use crate::diff::MatchOptions;
use crate::model::Report;

use super::keys::KeyIds;
use super::merge::{Merger, TracePart};
use super::types::{GroupBy, TraceTotals};

/// A trace to analyze, with what its path says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceSource {
    /// The trace directory.
    pub path: PathBuf,
    /// Its host, from a `host=` partition (else meta.json's is used).
    pub host: Option<String>,
    /// Its id, from a `trace=` partition (else the directory's name).
    pub trace: Option<String>,
}

impl From<memleak_trace::FoundTrace> for TraceSource {
    fn from(f: memleak_trace::FoundTrace) -> TraceSource {
        TraceSource {
            path: f.path,
            host: f.host,
            trace: f.trace,
        }
    }
}

/// How a multi-trace analysis runs and groups.
#[derive(Debug, Clone, Default)]
pub struct FleetOptions {
    /// The options every trace is analyzed with (`top` and `sort` apply
    /// to the merged report).
    pub analyze: AnalyzeOptions,
    /// How the breakdown is grouped.
    pub group_by: GroupBy,
    /// How stacks are matched across traces.
    pub matching: MatchOptions,
    /// What the summary names as its trace (the paths or the root given).
    pub label: String,
    /// Traces analyzed at once (0: one per worker thread). Each holds its
    /// replay's tables until it is reduced to its stacks, so this bounds
    /// memory.
    pub concurrent: usize,
}

/// Analyzes every trace of `sources` with `opts` and merges the reports
/// into one: stacks matched by their symbolized frames, with a breakdown
/// by trace ([`Fleet`](super::types::Fleet)).
///
/// `open` opens (and may check) each trace. Traces are analyzed a few at
/// a time, each on a thread of its own when there are enough of them to
/// keep the threads busy, else with the whole worker pool; each report
/// is reduced to its keyed stacks before the next trace starts, so
/// memory is that of `concurrent` analyses plus one entry per distinct
/// stack. The result
/// does not depend on the order the traces finish in. The first error
/// stops the run.
pub fn analyze_traces<E, F>(
    sources: &[TraceSource],
    opts: &FleetOptions,
    open: F,
    progress: Option<&(dyn Fn(u64) + Sync)>,
) -> Result<Report, E>
where
    E: From<memleak_trace::Error> + Send,
    F: Fn(&TraceSource) -> Result<Trace, E> + Sync,
{
    let threads = rayon::current_num_threads();
    let concurrent = match opts.concurrent {
        0 => threads,
        n => n,
    }
    .clamp(1, sources.len().max(1));
    let mut aopts = opts.analyze.clone();
    // The merged report sorts and cuts; every trace gives all its stacks.
    aopts.top = 0;
    if aopts.partitions == 0 {
        // The traces share the pool: partitions for the threads each has.
        aopts.partitions = (threads / (2 * concurrent)).max(1);
    }
    let merger = Mutex::new(Merger::new(sources.len()));
    let ids = Mutex::new(KeyIds::default());
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<(usize, E)>> = Mutex::new(None);
    let one = |i: usize| -> Result<(), E> {
        let source = &sources[i];
        let trace = open(source)?;
        let totals = identify(source, trace.meta());
        // In the pool, as a single trace's analysis runs: its waits help
        // with the pool's work rather than spin.
        let (report, tables) =
            rayon::scope(|_| analyze_trace_unresolved(&trace, &aopts, progress))?;
        drop(trace);
        // Stacks are keyed from the tables; only the stacks that come to
        // represent their key are given frames, by the merger.
        let part = TracePart::unresolved(i, totals, report, tables, opts.matching, &ids);
        let tables = crate::pool::lock_pool(&merger).add_part(part);
        // Freed outside the lock: tens of thousands of small strings.
        drop(tables);
        Ok(())
    };
    // With enough traces to keep every thread busy, each worker analyzes
    // its traces alone, on a pool of one thread: no thread of a trace's
    // analysis waits for another's work, and the keying and merging run
    // on the thread the analysis ran on. On the 200-host benchmark
    // (docs/benchmarks.md) the pool shared by two traces at a time sat
    // idle a quarter of the time. Fewer traces share the whole pool.
    let alone = concurrent >= threads && sources.len() >= 2 * threads;
    let work = || loop {
        if failed.load(Relaxed) {
            break;
        }
        let i = next.fetch_add(1, Relaxed);
        if i >= sources.len() {
            break;
        }
        if let Err(e) = one(i) {
            failed.store(true, Relaxed);
            let mut first = crate::pool::lock_pool(&first_error);
            // The error of the first trace in order, whatever
            // finished first.
            if first.as_ref().is_none_or(|(j, _)| i < *j) {
                *first = Some((i, e));
            }
            break;
        }
    };
    std::thread::scope(|s| {
        for _ in 0..concurrent {
            s.spawn(|| {
                let own = alone
                    .then(|| rayon::ThreadPoolBuilder::new().num_threads(1).build().ok())
                    .flatten();
                match own {
                    Some(pool) => pool.install(work),
                    None => work(),
                }
            });
        }
    });
    if let Some((_, e)) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let merger = merger.into_inner().unwrap_or_else(|e| e.into_inner());
    let ids = ids.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(merger.finish(&ids, opts.label.clone(), opts.group_by, opts.analyze.top))
}

/// A trace's host, id and command, from its path and meta.json.
fn identify(source: &TraceSource, meta: &Meta) -> TraceTotals {
    let dir_name = || {
        source
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| source.path.display().to_string())
    };
    TraceTotals {
        path: source.path.display().to_string(),
        host: source.host.clone().unwrap_or_else(|| meta.host.clone()),
        trace: source.trace.clone().unwrap_or_else(dir_name),
        command: traced_command(meta),
        ..Default::default()
    }
}

/// The command a trace recorded: what `record` started (its options'
/// `target_command`, else the words after `--` of memleak's command
/// line), else memleak's whole command line (`record -p PID`).
pub fn traced_command(meta: &Meta) -> String {
    let target: Vec<&str> = meta
        .options
        .get("target_command")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|w| w.as_str()).collect())
        .unwrap_or_default();
    if !target.is_empty() {
        return target.join(" ");
    }
    if let Some(dash) = meta.command.iter().position(|w| w == "--") {
        if dash + 1 < meta.command.len() {
            return meta.command[dash + 1..].join(" ");
        }
    }
    meta.command.join(" ")
}

/// A label for the traces of `paths`: the path, or the first and how many
/// more.
pub fn label(paths: &[&Path]) -> String {
    match paths {
        [] => String::new(),
        [one] => one.display().to_string(),
        [first, rest @ ..] => format!("{} and {} more", first.display(), rest.len()),
    }
}
