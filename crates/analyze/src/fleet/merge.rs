//! Merging the reports of many traces into one: each trace's [`Report`]
//! is reduced to its stacks keyed by symbolized frames (the diff's
//! [`stack_key`](crate::diff::stack_key), as numbers: [`super::keys`], so
//! that hosts and builds compare) and its totals ([`TracePart`]), then
//! added to the [`Merger`], which holds one entry per key whatever the
//! number of traces.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::Mutex;

use crate::analysis::Tables;
use crate::diff::MatchOptions;
use crate::growth::{Growth, Timeline};
use crate::hash::IntHasher;
use crate::histogram::SizeCount;
use crate::model::{LeakSummary, Report, StackReport, Summary, SuppressedTotals};
use crate::verdicts::VerdictTotals;

use super::keys::{stack_key_ids, KeyIds, StackKey};
use super::types::{Fleet, GroupBy, GroupTotals, StackOrigin, TraceTotals};

/// One trace's report, reduced to what the merged report needs: its
/// replay's tables are gone with the report.
pub struct TracePart {
    index: usize,
    totals: TraceTotals,
    summary: Summary,
    timeline: Option<Timeline>,
    stacks: Vec<(StackKey, StackReport)>,
    /// The tables the stacks' frames are resolved from: the report left
    /// them unresolved, and only a stack that becomes its key's
    /// representative needs its frames.
    tables: Tables,
}

impl TracePart {
    /// Reduces `report`, of the trace at `index` in the report's order,
    /// whose identity is `totals` (its figures are filled in here). Its
    /// stacks were left without their frames, which `tables` resolve
    /// ([`analyze_trace_unresolved`](crate::analysis::analyze_trace_unresolved));
    /// they are keyed with the numbers of `ids`.
    pub(crate) fn unresolved(
        index: usize,
        mut totals: TraceTotals,
        report: Report,
        tables: Tables,
        opts: MatchOptions,
        ids: &Mutex<KeyIds>,
    ) -> TracePart {
        let rows = crate::pool::lock_pool(ids).rows(&tables.frames, opts);
        let Report {
            summary,
            stacks,
            timeline,
            ..
        } = report;
        let s = &summary;
        totals.events = s.events;
        totals.duration_ns = s.duration_ns();
        totals.complete = s.complete;
        totals.lost_by_reason = s.lost_by_reason.clone();
        totals.bytes = s.outstanding_bytes;
        totals.count = s.outstanding_allocations;
        totals.stacks = s.outstanding_stacks;
        totals.peak_bytes = s.peak_bytes;
        totals.scans = s.leak.as_ref().map_or(0, |l| l.scans.len() as u64);
        let stacks = stacks
            .into_iter()
            .map(|st| {
                let rec = tables.stacks.get(&st.stack_id);
                (stack_key_ids(st.stack_id, rec, &tables.frames, &rows), st)
            })
            .collect();
        TracePart {
            index,
            totals,
            summary,
            timeline,
            stacks,
            tables,
        }
    }
}

/// A key's stack, merged over the traces added so far.
struct Merged {
    stack: StackReport,
    /// Bytes and trace index of the stack whose id, pid, frames and
    /// contents `stack` shows: the most bytes, then the first trace.
    rep: (u64, usize),
    samples: Vec<u64>,
    /// (trace index, bytes, count) of each trace holding the key.
    held: Vec<(usize, u64, u64)>,
    /// Bytes and count of the stack in traces whose report had verdicts.
    scanned: (u64, u64),
}

/// The merged report under construction.
#[derive(Default)]
pub struct Merger {
    traces: Vec<Option<TraceTotals>>,
    keys: HashMap<StackKey, Merged, BuildHasherDefault<IntHasher>>,
    summary: Summary,
    first: Option<usize>,
    window_ns: u64,
    timeline: Vec<u64>,
    leak: Option<VerdictTotals>,
    /// Outstanding bytes and count of traces without verdicts.
    unscanned: (u64, u64),
    captures: Vec<Option<String>>,
    suppressed: BTreeMap<String, (u64, u64)>,
}

impl Merger {
    /// A merger of `n` traces.
    pub fn new(n: usize) -> Merger {
        Merger {
            traces: vec![None; n],
            summary: Summary {
                complete: true,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Adds a trace's part, and returns what is left of it (its tables),
    /// for the caller to free outside its lock. Parts may come in any
    /// order: the result is the same.
    pub(crate) fn add_part(&mut self, part: TracePart) -> Tables {
        let TracePart {
            index,
            totals,
            summary: s,
            timeline,
            stacks,
            tables,
        } = part;
        self.add_summary(index, &s);
        if let Some(t) = timeline {
            self.window_ns = self.window_ns.max(t.window_ns);
            add_samples(&mut self.timeline, &t.total_bytes);
        }
        let has_verdicts = s.leak.is_some();
        if !has_verdicts {
            self.unscanned.0 += s.outstanding_bytes;
            self.unscanned.1 += s.outstanding_allocations;
        }
        for (key, st) in stacks {
            self.add_stack(index, key, st, has_verdicts, &tables);
        }
        self.traces[index] = Some(totals);
        tables
    }

    fn add_summary(&mut self, index: usize, s: &Summary) {
        let m = &mut self.summary;
        if self.first.is_none_or(|f| index < f) {
            // What every trace shares: the options it was analyzed with.
            self.first = Some(index);
            m.filters = s.filters.clone();
            m.sort = s.sort;
            m.temporary_threshold_ns = s.temporary_threshold_ns;
            m.at_given = s.at_given;
            m.scan_note = s.scan_note.clone();
        }
        self.captures.push(s.capture.clone());
        // One sampled trace makes the merged figures estimates; each
        // trace's were scaled by its own mean, and the report names the
        // first trace's (in trace order).
        if s.sampling.is_some() && (m.sampling.is_none() || self.first == Some(index)) {
            m.sampling = s.sampling;
        }
        m.eval_ts = m.eval_ts.max(s.duration_ns());
        for (k, v) in &s.events_by_kind {
            *m.events_by_kind.entry(k.clone()).or_default() += v;
        }
        m.events += s.events;
        m.allocations += s.allocations;
        m.frees += s.frees;
        m.allocated_bytes += s.allocated_bytes;
        m.freed_bytes += s.freed_bytes;
        m.outstanding_bytes += s.outstanding_bytes;
        m.outstanding_allocations += s.outstanding_allocations;
        for (to, from) in [
            (
                &mut m.outstanding_by_class.heap,
                s.outstanding_by_class.heap,
            ),
            (
                &mut m.outstanding_by_class.mapped,
                s.outstanding_by_class.mapped,
            ),
            (
                &mut m.outstanding_by_class.kernel,
                s.outstanding_by_class.kernel,
            ),
        ] {
            to.bytes += from.bytes;
            to.allocations += from.allocations;
        }
        // Traces peak at different times, on different clocks: the highest
        // of their peaks, each trace's own in the breakdown.
        if (s.peak_bytes, std::cmp::Reverse(s.peak_ns))
            > (m.peak_bytes, std::cmp::Reverse(m.peak_ns))
        {
            m.peak_bytes = s.peak_bytes;
            m.peak_ns = s.peak_ns;
        }
        m.anomalies.unknown_frees += s.anomalies.unknown_frees;
        m.anomalies.double_frees += s.anomalies.double_frees;
        m.anomalies.missed_frees += s.anomalies.missed_frees;
        for (k, v) in &s.lost_by_reason {
            *m.lost_by_reason.entry(k.clone()).or_default() += v;
        }
        if let Some(c) = s.cut_stacks {
            *m.cut_stacks.get_or_insert(0) += c;
        }
        m.age_histogram.merge(&s.age_histogram);
        m.temporary_allocations += s.temporary_allocations;
        m.allocation_sizes.merge(&s.allocation_sizes);
        m.outstanding_sizes.merge(&s.outstanding_sizes);
        m.rate_interval_ns = m.rate_interval_ns.max(s.rate_interval_ns);
        m.complete &= s.complete;
        if let Some(l) = &s.leak {
            self.leak
                .get_or_insert_with(Default::default)
                .merge(&l.totals);
        }
        for sup in &s.suppressed {
            let e = self.suppressed.entry(sup.name.clone()).or_default();
            e.0 += sup.bytes;
            e.1 += sup.allocations;
        }
    }

    fn add_stack(
        &mut self,
        index: usize,
        key: StackKey,
        mut st: StackReport,
        has_verdicts: bool,
        tables: &Tables,
    ) {
        let rep = (st.bytes, index);
        let better = |old: (u64, usize)| rep.0 > old.0 || (rep.0 == old.0 && rep.1 < old.1);
        let samples = st.growth.take().map(|g| g.samples);
        // The frames of the stack that represents its key, resolved from
        // the tables (the report left them out).
        let frames_of = |st: &mut StackReport| {
            tables
                .stacks
                .get(&st.stack_id)
                .map(|r| crate::stacks::resolve_frames(r, &tables.frames))
                .unwrap_or_default()
        };
        let m = match self.keys.entry(key) {
            Entry::Vacant(v) => v.insert(Merged {
                stack: StackReport {
                    stack_id: st.stack_id,
                    pid: st.pid,
                    kernel: st.kernel,
                    truncated: st.truncated,
                    known: st.known,
                    frames: frames_of(&mut st),
                    contents: std::mem::take(&mut st.contents),
                    ..Default::default()
                },
                rep,
                samples: Vec::new(),
                held: Vec::new(),
                scanned: (0, 0),
            }),
            Entry::Occupied(o) => {
                let m = o.into_mut();
                if better(m.rep) {
                    m.rep = rep;
                    m.stack.stack_id = st.stack_id;
                    m.stack.pid = st.pid;
                    m.stack.known = st.known;
                    m.stack.frames = frames_of(&mut st);
                    m.stack.contents = std::mem::take(&mut st.contents);
                }
                m
            }
        };
        let t = &mut m.stack;
        t.bytes += st.bytes;
        t.count += st.count;
        t.mapped_bytes += st.mapped_bytes;
        t.mapped_count += st.mapped_count;
        if st.count > 0 {
            t.oldest_age_ns = t.oldest_age_ns.max(st.oldest_age_ns);
        }
        t.allocated_bytes += st.allocated_bytes;
        t.allocations += st.allocations;
        t.temporary += st.temporary;
        merge_sizes(&mut t.allocation_sizes, &st.allocation_sizes);
        t.age_histogram.merge(&st.age_histogram);
        if let Some(s) = samples {
            add_samples(&mut m.samples, &s);
        }
        if let (true, Some(v)) = (has_verdicts, st.verdicts) {
            t.verdicts.get_or_insert_with(Default::default).merge(&v);
            m.scanned.0 += st.bytes;
            m.scanned.1 += st.count;
        }
        if st.count > 0 {
            match m.held.last_mut() {
                // Stacks of one trace under one key come together.
                Some(h) if h.0 == index => {
                    h.1 += st.bytes;
                    h.2 += st.count;
                }
                _ => m.held.push((index, st.bytes, st.count)),
            }
        }
    }

    /// The merged report, its trace breakdown grouped `by`; `label` names
    /// the traces in its summary, `ids` numbered the parts' keys.
    pub(crate) fn finish(self, ids: &KeyIds, label: String, by: GroupBy, top: usize) -> Report {
        let Merger {
            traces,
            keys,
            mut summary,
            window_ns,
            timeline,
            leak,
            unscanned,
            captures,
            suppressed,
            ..
        } = self;
        // Every trace was added (indices are positions in `traces`).
        let traces: Vec<TraceTotals> = traces.into_iter().map(Option::unwrap_or_default).collect();
        summary.trace = label;
        summary.capture = match captures.first() {
            Some(c) if captures.iter().all(|x| x == c) => c.clone(),
            _ => None,
        };
        // Each trace's times count from its own start.
        summary.start_ts = 0;
        summary.suppressed = suppressed
            .into_iter()
            .map(|(name, (bytes, allocations))| SuppressedTotals {
                name,
                bytes,
                allocations,
            })
            .collect();
        summary
            .suppressed
            .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
        let window_ns = window_ns.max(1);
        // Sorted by key first: equal stacks keep an order that does not
        // depend on the order the traces finished in.
        let mut keyed: Vec<(String, Merged)> =
            keys.into_iter().map(|(k, m)| (ids.text(&k), m)).collect();
        keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut stacks = Vec::with_capacity(keyed.len());
        for (key, m) in keyed {
            let mut st = m.stack;
            st.growth = Some(Growth::classify(
                pad(m.samples, crate::growth::WINDOWS),
                window_ns,
            ));
            if leak.is_some() {
                // Blocks of traces without a scan are unscanned ones.
                let v = st.verdicts.get_or_insert_with(Default::default);
                v.unscanned.bytes += st.bytes - m.scanned.0;
                v.unscanned.allocations += st.count - m.scanned.1;
            }
            let mut groups: BTreeMap<String, GroupTotals> = BTreeMap::new();
            for &(i, bytes, count) in &m.held {
                let t = &traces[i];
                let g = groups
                    .entry(t.group_key(by))
                    .or_insert_with(|| GroupTotals {
                        group: t.group(by),
                        ..Default::default()
                    });
                g.traces += 1;
                g.bytes += bytes;
                g.count += count;
            }
            let rep = &traces[m.rep.1];
            st.origin = Some(Box::new(StackOrigin {
                key,
                host: rep.host.clone(),
                trace: rep.trace.clone(),
                traces: m.held.len() as u64,
                groups: sorted(groups.into_values().collect()),
            }));
            summary.outstanding_stacks += (st.count > 0) as u64;
            stacks.push(st);
        }
        summary.leak = leak.map(|mut totals| {
            totals.unscanned.bytes += unscanned.0;
            totals.unscanned.allocations += unscanned.1;
            // Each trace's scans are its own (pids of its host): the
            // breakdown counts them.
            LeakSummary {
                scans: Vec::new(),
                totals,
            }
        });
        if summary.leak.is_some() {
            crate::stacks::sort_stacks_by_verdict(&mut stacks, summary.sort);
        } else {
            crate::stacks::sort_stacks(&mut stacks, summary.sort);
        }
        let mut groups: BTreeMap<String, GroupTotals> = BTreeMap::new();
        for t in &traces {
            let g = groups
                .entry(t.group_key(by))
                .or_insert_with(|| GroupTotals {
                    group: t.group(by),
                    ..Default::default()
                });
            g.traces += 1;
            g.bytes += t.bytes;
            g.count += t.count;
        }
        let groups = sorted(groups.into_values().collect());
        Report {
            summary,
            stacks,
            top,
            timeline: Some(Timeline {
                start_ns: 0,
                window_ns,
                total_bytes: pad(timeline, crate::growth::WINDOWS),
            }),
            fleet: Some(Box::new(Fleet {
                group_by: by,
                traces,
                groups,
            })),
            spent: Default::default(),
        }
    }
}

/// Most bytes first, then most allocations, then by name.
fn sorted(mut groups: Vec<GroupTotals>) -> Vec<GroupTotals> {
    groups.sort_by(|a, b| {
        (b.bytes, b.count)
            .cmp(&(a.bytes, a.count))
            .then_with(|| a.group.cmp(&b.group))
    });
    groups
}

/// Adds `from` to `to` window by window: traces are sampled in the same
/// number of windows, each of its own span, so the i-th windows of all
/// traces are the same fraction of their recordings.
fn add_samples(to: &mut Vec<u64>, from: &[u64]) {
    if to.len() < from.len() {
        to.resize(from.len(), 0);
    }
    for (t, f) in to.iter_mut().zip(from) {
        *t += f;
    }
}

fn pad(mut v: Vec<u64>, n: usize) -> Vec<u64> {
    if v.len() < n {
        v.resize(n, 0);
    }
    v
}

/// Adds the size buckets of `from` to `to`, both smallest first.
fn merge_sizes(to: &mut Vec<SizeCount>, from: &[SizeCount]) {
    // One walk over both, as a stack's buckets are mostly in `to`
    // already; the others are inserted after.
    let mut i = 0;
    let mut missing = false;
    for f in from {
        while i < to.len() && to[i].low < f.low {
            i += 1;
        }
        match to.get_mut(i) {
            Some(t) if t.low == f.low => t.count += f.count,
            _ => missing = true,
        }
    }
    if missing {
        for f in from {
            if let Err(i) = to.binary_search_by(|t| t.low.cmp(&f.low)) {
                to.insert(i, *f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buckets of `lows` (ascending), each with `count`.
    fn buckets(lows: &[u64], count: u64) -> Vec<SizeCount> {
        lows.iter()
            .map(|&low| SizeCount {
                low,
                high: low * 2 - 1,
                count,
            })
            .collect()
    }

    #[test]
    fn sizes_merge_into_one_ascending_list() {
        let cases: [(&[u64], &[u64]); 6] = [
            (&[], &[1, 4]),
            (&[1, 4], &[]),
            (&[1, 4, 16], &[4, 16]),
            (&[4, 16], &[1, 4, 8, 32]),
            (&[2, 8], &[1, 4, 16]),
            (&[1, 2, 4, 8], &[1, 2, 4, 8]),
        ];
        for (a, b) in cases {
            let mut got = buckets(a, 1);
            merge_sizes(&mut got, &buckets(b, 10));
            let mut lows: Vec<u64> = a.iter().chain(b).copied().collect();
            lows.sort_unstable();
            lows.dedup();
            let want: Vec<SizeCount> = lows
                .iter()
                .map(|&low| SizeCount {
                    low,
                    high: low * 2 - 1,
                    count: a.contains(&low) as u64 + 10 * b.contains(&low) as u64,
                })
                .collect();
            assert_eq!(got, want, "{a:?} + {b:?}");
        }
    }
}
