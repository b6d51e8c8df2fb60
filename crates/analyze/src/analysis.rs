//! The analysis of a trace ([`analyze_trace`]): replays it and builds the
//! [`Report`] (`model.rs`): summary, outstanding allocations by stack with
//! resolved frames, age histograms, verdicts and growth. The output
//! formats (`report/`) render it.

use std::collections::HashSet;
use std::path::Path;

use memleak_trace::Trace;

use crate::filter::{Filter, ResolvedFilter};
use crate::frame_table::FrameTable;
use crate::histogram::AgeHistogram;
use crate::model::{
    AtPeak, LeakSummary, PidPeak, Report, SortKey, Spent, Summary, SuppressedTotals,
};
use crate::replay::{replay, GrowthPlan, ReplayOptions};
use crate::stack_table::StackTable;
use crate::stacks::{build_stacks, sort_stacks, sort_stacks_by_verdict, Join};
use crate::suppress::Suppression;
use crate::verdicts::{Scans, VerdictSet};

/// What the analysis considers and how it lays the report out.
#[derive(Debug, Clone, Default)]
pub struct AnalyzeOptions {
    /// Which events and allocations count.
    pub filter: Filter,
    /// Evaluate the state at this time (ns since trace start) instead of
    /// at the end; events after it are ignored.
    pub at_ns: Option<u64>,
    /// Evaluate the state at the peak of the live total (with pids
    /// selected, at the highest peak of a selected process); overrides
    /// `at_ns`.
    pub at_peak: bool,
    /// Stacks shown in text and JSON (0: all).
    pub top: usize,
    /// Order of the stacks.
    pub sort: SortKey,
    /// Group the stacks by their worst scan verdict (definitely lost
    /// first) before `sort` orders each group; [`SortKey::Verdict`] does
    /// too. No effect without a scan that applies.
    pub group_by_verdict: bool,
    /// Replay partitions (0: one per two rayon threads).
    pub partitions: usize,
    /// Which scan verdicts count (`--verdict`); blocks of the others are
    /// left out of every report. Everything by default.
    pub verdicts: VerdictSet,
    /// Suppressions: blocks of matching stacks are left out and counted
    /// by suppression name. None by default (the CLI adds its default
    /// file).
    pub suppressions: Vec<Suppression>,
    /// An allocation freed within this (ns) may be temporary (see
    /// [`behaviour`](crate::behaviour)); `None`: 1 ms.
    pub temporary_threshold_ns: Option<u64>,
}

/// Opens, replays and reports on the trace at `path`.
///
/// This is the whole of `memleak analyze` but the output; tests and other
/// tools call it to get a [`Report`] to inspect or render.
pub fn analyze(path: impl AsRef<Path>, opts: &AnalyzeOptions) -> memleak_trace::Result<Report> {
    // Replay checks the events files' checksums as it reads them.
    let trace = Trace::open_deferred(path)?;
    analyze_trace(&trace, opts, None)
}

/// Like [`analyze`] for an open trace, calling `progress` with the number
/// of rows replayed after each row group.
pub fn analyze_trace(
    trace: &Trace,
    opts: &AnalyzeOptions,
    progress: Option<&(dyn Fn(u64) + Sync)>,
) -> memleak_trace::Result<Report> {
    Ok(analyze_trace_with(trace, opts, progress, true)?.0)
}

/// A trace's stacks table by stack id, and its frames table by pid and
/// address.
pub(crate) struct Tables {
    pub(crate) stacks: StackTable,
    pub(crate) frames: FrameTable,
}

/// Like [`analyze_trace`], but the report's stacks are left without their
/// frames, and unsorted, and the tables they are resolved from are
/// returned with it: a
/// caller that keys the stacks by their records
/// (the fleet's `stack_key_ids`) resolves only the stacks it
/// keeps ([`resolve_frames`](crate::stacks::resolve_frames)).
pub(crate) fn analyze_trace_unresolved(
    trace: &Trace,
    opts: &AnalyzeOptions,
    progress: Option<&(dyn Fn(u64) + Sync)>,
) -> memleak_trace::Result<(Report, Tables)> {
    let (report, tables) = analyze_trace_with(trace, opts, progress, false)?;
    Ok((report, tables.expect("the tables of an unresolved report")))
}

/// The analysis; with `resolve`, the stacks' frames are resolved and the
/// tables are kept by the report ([`Spent`]), else they are returned.
fn analyze_trace_with(
    trace: &Trace,
    opts: &AnalyzeOptions,
    progress: Option<&(dyn Fn(u64) + Sync)>,
    resolve: bool,
) -> memleak_trace::Result<(Report, Option<Tables>)> {
    let clock = std::time::Instant::now();
    let meta = trace.meta();
    let start_ts = start_ts(trace)?;
    let filter = opts.filter.resolve(start_ts);
    // A selected process starts with a copy of its parent's heap at fork:
    // replay the ancestors too, and keep only the selected processes'
    // blocks in the report.
    let mut replay_filter = opts.filter.clone();
    replay_filter
        .pids
        .extend(ancestors(&opts.filter.pids, meta));
    let (at_ts, at_row, at_peak) = if opts.at_peak {
        let (peak, row) = find_peak(trace, opts, replay_filter.resolve(start_ts), start_ts)?;
        (Some(start_ts + peak.ns), row, Some(peak))
    } else {
        (opts.at_ns.map(|a| start_ts.saturating_add(a)), None, None)
    };
    let plan = growth_plan(trace, opts, at_ts, start_ts, &filter, meta)?;
    let prepared = clock.elapsed();
    let ropts = ReplayOptions {
        filter: replay_filter.resolve(start_ts),
        at_ts,
        at_row,
        partitions: opts.partitions,
        progress,
        // Unknown yet: per-stack arrays grow as ids show up.
        max_stack_id: Some(0),
        growth: Some(plan.clone()),
        temporary_ns: temporary_ns(opts),
        sampling: meta.sampling,
    };
    // The stacks and frames tables are read, and indexed, while the events
    // replay: the pool has idle moments (the first decode, waiting for
    // the replay thread) to fill.
    let (replayed, tables) = rayon::join(
        || replay(trace, &ropts),
        || -> memleak_trace::Result<_> {
            let stacks = StackTable::new(trace.stack_columns()?);
            let frames = FrameTable::new(trace.frame_columns()?);
            let suppressed = crate::suppress::match_stacks(&opts.suppressions, &stacks, &frames);
            // Every scan is at or before the end; only --at can precede one.
            let scans = Scans::load(trace, at_ts.unwrap_or(u64::MAX))?;
            Ok((stacks, frames, suppressed, scans))
        },
    );
    let mut replayed = replayed?;
    let (stacks_by_id, frames, suppressed_stacks, scans) = tables?;
    let replay_done = clock.elapsed();
    let samples = replayed.take_growth().unwrap_or_default();
    let stats = replayed.stats();
    let eval_ts = match at_ts {
        Some(at) => at,
        // Ages count to the end of the recording, which may be well after
        // the last allocator call.
        None => meta
            .end_ns
            .max(stats.last_ts.unwrap_or(start_ts))
            .max(start_ts),
    };

    // A forked child's copies of its parent's blocks are the parent's to
    // report (or gone with the parent's exec): they are the child's only
    // when it is looked at without its parent, as valgrind run on the
    // child alone would see them.
    let inherited_for: HashSet<u32> = inherited_for(&opts.filter.pids, meta);
    let (scan_index, scan_note) = match scans {
        Scans::None => (None, None),
        Scans::AfterEval(s) => {
            let first = s.iter().map(|s| s.ts_ns).min().unwrap_or(0);
            let note = format!(
                "the scan{} at {} {} after the evaluation time: no verdicts",
                if s.len() == 1 { "" } else { "s" },
                crate::time::format_duration(first.saturating_sub(start_ts)),
                if s.len() == 1 { "is" } else { "are" }
            );
            (None, Some(note))
        }
        Scans::Apply(index) => (Some(index), None),
    };
    let join = Join {
        scan: scan_index.as_ref(),
        verdicts: opts.verdicts,
        suppressions: &opts.suppressions,
        suppressed_stacks: &suppressed_stacks,
        sampling: meta.sampling,
    };
    let (mut stacks, by_class, leak_totals, suppressed_totals, outstanding_sizes) = build_stacks(
        &stacks_by_id,
        resolve.then_some(&frames),
        &replayed,
        &filter,
        (&opts.filter.pids, &inherited_for),
        eval_ts,
        &join,
    );
    let held: Vec<(u64, crate::growth::Held)> = stacks
        .iter()
        .map(|s| {
            let held = crate::growth::Held {
                count: s.count,
                mean_size: s.allocated_bytes.checked_div(s.allocations).unwrap_or(0),
            };
            (s.stack_id, held)
        })
        .collect();
    // A merger classifies the samples it adds up, not each trace's.
    let (growths, timeline) =
        crate::growth::classify_stacks(&held, samples, &plan, start_ts, resolve);
    for (s, g) in stacks.iter_mut().zip(growths) {
        s.growth = Some(g);
    }
    // Grouped by verdict only when asked: the order the headers name is
    // the order the stacks are in.
    let group_by_verdict =
        join.scan.is_some() && (opts.group_by_verdict || opts.sort == SortKey::Verdict);
    // Stacks left unresolved go to a merger, which sorts what it merges.
    if resolve {
        if group_by_verdict {
            sort_stacks_by_verdict(&mut stacks, opts.sort);
        } else {
            sort_stacks(&mut stacks, opts.sort);
        }
    }
    if std::env::var_os("MEMLEAK_ANALYZE_TIMING").is_some() {
        let end = clock.elapsed();
        eprintln!(
            "memleak: timing: prepare {:.3}s, replay and tables {:.3}s, stacks {:.3}s (wall)",
            prepared.as_secs_f64(),
            (replay_done - prepared).as_secs_f64(),
            (end - replay_done).as_secs_f64()
        );
    }
    let leak = scan_index.as_ref().map(|index| LeakSummary {
        scans: index.scans.clone(),
        totals: leak_totals,
    });
    let mut suppressed: Vec<SuppressedTotals> = Vec::new();
    for (i, t) in suppressed_totals.iter().enumerate() {
        if t.allocations == 0 && t.bytes == 0 {
            continue;
        }
        let name = &opts.suppressions[i].name;
        match suppressed.iter_mut().find(|s| &s.name == name) {
            Some(s) => {
                s.bytes += t.bytes;
                s.allocations += t.allocations;
            }
            None => suppressed.push(SuppressedTotals {
                name: name.clone(),
                bytes: t.bytes,
                allocations: t.allocations,
            }),
        }
    }
    suppressed.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    let mut age_histogram = AgeHistogram::default();
    let (mut outstanding_bytes, mut outstanding_allocations, mut outstanding_stacks) = (0, 0, 0);
    for s in &stacks {
        age_histogram.merge(&s.age_histogram);
        outstanding_bytes += s.bytes;
        outstanding_allocations += s.count;
        outstanding_stacks += (s.count > 0) as u64;
    }
    // An ancestor replayed for what it passed on to a selected process is
    // not reported.
    let mut process_peaks: Vec<PidPeak> = stats
        .process_peaks
        .iter()
        .filter(|p| opts.filter.pids.is_empty() || opts.filter.pids.contains(&p.pid))
        .map(|p| PidPeak {
            pid: p.pid,
            peak_bytes: p.bytes,
            peak_ns: p.ts.saturating_sub(start_ts),
        })
        .collect();
    process_peaks.sort_unstable_by(|a, b| b.peak_bytes.cmp(&a.peak_bytes).then(a.pid.cmp(&b.pid)));
    let summary = Summary {
        trace: trace.path().display().to_string(),
        capture: trace.meta().capture.clone(),
        sampling: meta.sampling,
        start_ts,
        eval_ts,
        at_given: at_ts.is_some(),
        at_peak,
        events_by_kind: stats
            .events_by_kind
            .iter()
            .map(|(k, &v)| (k.name().to_string(), v))
            .collect(),
        events: stats.events(),
        allocations: stats.allocations,
        frees: stats.frees,
        allocated_bytes: stats.allocated_bytes,
        freed_bytes: stats.freed_bytes,
        outstanding_bytes,
        outstanding_allocations,
        outstanding_stacks,
        outstanding_by_class: by_class,
        peak_bytes: stats.peak_bytes,
        peak_ns: stats.peak_ts.saturating_sub(start_ts),
        process_peaks,
        anomalies: stats.anomalies,
        lost_by_reason: meta.counters.lost.clone(),
        cut_stacks: meta.cut_stacks,
        age_histogram,
        temporary_allocations: stats.temporary,
        temporary_threshold_ns: temporary_ns(opts),
        allocation_sizes: replayed.allocation_sizes().clone(),
        outstanding_sizes,
        rate_interval_ns: crate::behaviour::rate_interval(start_ts, eval_ts, &opts.filter),
        complete: meta.complete,
        incomplete: trace.incomplete(),
        filters: {
            let mut f = describe_filters(
                &opts.filter,
                opts.at_ns.filter(|_| !opts.at_peak),
                opts.verdicts,
            );
            if opts.at_peak {
                f.push("at=peak".into());
            }
            f
        },
        sort: opts.sort,
        group_by_verdict,
        leak,
        scan_note,
        suppressed,
    };
    let (spent, tables) = if resolve {
        let spent: std::sync::Arc<dyn std::any::Any + Send + Sync> =
            std::sync::Arc::new((replayed, stacks_by_id, frames, scan_index));
        (spent, None)
    } else {
        let tables = Tables {
            stacks: stacks_by_id,
            frames,
        };
        let spent: std::sync::Arc<dyn std::any::Any + Send + Sync> =
            std::sync::Arc::new((replayed, scan_index));
        (spent, Some(tables))
    };
    let report = Report {
        summary,
        stacks,
        top: opts.top,
        timeline: Some(timeline),
        fleet: None,
        spent: Spent(Some(spent)),
    };
    Ok((report, tables))
}

/// The selected processes whose copies of their parent's blocks (made at
/// fork) count as theirs: those looked at without their parent, as
/// valgrind run on the child alone would see them.
fn inherited_for<C: FromIterator<u32>>(pids: &[u32], meta: &memleak_trace::Meta) -> C {
    pids.iter()
        .copied()
        .filter(|p| {
            meta.parents
                .get(p)
                .is_none_or(|parent| !pids.contains(parent))
        })
        .collect()
}

/// Replays the trace once to find the peak an `--at peak` report is
/// evaluated at: the live total's, or with pids selected, the highest of
/// the selected processes' peaks (the earliest of equal ones), and the
/// row that reached it: events share timestamps, and a free stamped like
/// the allocation that reached the peak must not count. A trace that
/// never held anything peaks at its start.
fn find_peak(
    trace: &Trace,
    opts: &AnalyzeOptions,
    filter: ResolvedFilter,
    start_ts: u64,
) -> memleak_trace::Result<(AtPeak, Option<u64>)> {
    let ropts = ReplayOptions {
        filter,
        // Several partitions tell which row reached the peak.
        partitions: opts.partitions.max(2),
        sampling: trace.meta().sampling,
        ..Default::default()
    };
    let r = replay(trace, &ropts)?;
    let st = r.stats();
    let (pid, bytes, ts, row) = if opts.filter.pids.is_empty() {
        (None, st.peak_bytes, st.peak_ts, st.peak_row)
    } else {
        st.process_peaks
            .iter()
            .filter(|p| opts.filter.pids.contains(&p.pid))
            .max_by(|a, b| a.bytes.cmp(&b.bytes).then(b.ts.cmp(&a.ts)))
            .map_or((None, 0, start_ts, None), |p| {
                (Some(p.pid), p.bytes, p.ts, p.row)
            })
    };
    let peak = AtPeak {
        pid,
        bytes,
        ns: ts.max(start_ts) - start_ts,
    };
    Ok((peak, row))
}

/// What the growth samples count and when: the windows span the trace
/// from its start to `--at`, else to the last event; the allocations are
/// those the report's filters select (with `--older-than`, those old
/// enough at the evaluation time).
fn growth_plan(
    trace: &Trace,
    opts: &AnalyzeOptions,
    at_ts: Option<u64>,
    start_ts: u64,
    filter: &ResolvedFilter,
    meta: &memleak_trace::Meta,
) -> memleak_trace::Result<GrowthPlan> {
    let last_ts = last_event_ts(trace)?;
    // The windows end at the last event: after it nothing changes, and a
    // recording that goes on after its program exited would otherwise
    // show every stack flat at the end.
    let end = at_ts.unwrap_or(last_ts).max(start_ts);
    let windows = crate::growth::WINDOWS;
    let window_ns = (end - start_ts).div_ceil(windows as u64).max(1);
    // The report's evaluation time, which `--older-than` counts from.
    let eval_ts = at_ts.unwrap_or(meta.end_ns.max(last_ts)).max(start_ts);
    let (min_size, max_size, from_ts, to_ts) = filter.allocation_bounds(eval_ts);
    let inherited_for = inherited_for(&opts.filter.pids, meta);
    Ok(GrowthPlan {
        start_ts,
        window_ns,
        windows,
        pids: opts.filter.pids.clone(),
        inherited_for,
        min_size,
        max_size,
        from_ts,
        to_ts,
    })
}

/// The timestamp of the trace's last event (0 if it has none).
fn last_event_ts(trace: &Trace) -> memleak_trace::Result<u64> {
    Ok(match trace.event_units().last() {
        Some(u) => trace.unit_ts_range(u)?.map_or(0, |r| r.1),
        None => 0,
    })
}

/// The threshold of temporary allocations of `opts`, ns.
fn temporary_ns(opts: &AnalyzeOptions) -> u64 {
    opts.temporary_threshold_ns
        .unwrap_or(crate::replay::DEFAULT_TEMPORARY_NS)
        .max(1)
}

/// The ancestors of `pids`, from the `parents` map the recorder keeps in
/// meta.json (child pid -> parent pid, from fork events).
fn ancestors(pids: &[u32], meta: &memleak_trace::Meta) -> Vec<u32> {
    let parent_of = |p: u32| meta.parents.get(&p).copied();
    let mut out = Vec::new();
    for &pid in pids {
        let mut p = pid;
        // Bounded: a corrupt map must not loop.
        for _ in 0..64 {
            match parent_of(p) {
                Some(parent)
                    if parent != p && !pids.contains(&parent) && !out.contains(&parent) =>
                {
                    out.push(parent);
                    p = parent;
                }
                _ => break,
            }
        }
    }
    out
}

/// Recording start, or the first event if the meta does not say.
fn start_ts(trace: &Trace) -> memleak_trace::Result<u64> {
    let meta = trace.meta().start_ns;
    if meta != 0 {
        return Ok(meta);
    }
    Ok(match trace.event_units().first() {
        Some(u) => trace.unit_ts_range(u)?.map_or(0, |r| r.0),
        None => 0,
    })
}

fn describe_filters(f: &Filter, at: Option<u64>, verdicts: VerdictSet) -> Vec<String> {
    use crate::filter::KindScope;
    use crate::time::format_duration;
    let mut out = Vec::new();
    if !f.pids.is_empty() {
        let p: Vec<String> = f.pids.iter().map(|p| p.to_string()).collect();
        out.push(format!("pid={}", p.join(",")));
    }
    match f.kind {
        KindScope::All => {}
        KindScope::User => out.push("kind=user".into()),
        KindScope::Kernel => out.push("kind=kernel".into()),
        KindScope::Heap => out.push("kind=heap".into()),
        KindScope::Mmap => out.push("kind=mmap".into()),
    }
    if let Some(v) = f.min_size {
        out.push(format!("min-size={v}"));
    }
    if let Some(v) = f.max_size {
        out.push(format!("max-size={v}"));
    }
    if let Some(v) = f.from_ns {
        out.push(format!("from={}", format_duration(v)));
    }
    if let Some(v) = f.to_ns {
        out.push(format!("to={}", format_duration(v)));
    }
    if let Some(v) = f.older_than_ns {
        out.push(format!("older-than={}", format_duration(v)));
    }
    if let Some(v) = at {
        out.push(format!("at={}", format_duration(v)));
    }
    if !verdicts.is_all() {
        out.push(format!("verdict={}", verdicts.describe()));
    }
    out
}
