//! The report's stacks, built from a replay: the outstanding blocks
//! folded by stack (bytes, counts, ages, sizes), their frames resolved,
//! the scan's verdicts and the suppressions joined
//! ([`build_stacks`]); and the orders they are listed in
//! ([`sort_stacks`], [`sort_stacks_by_verdict`]).

use std::collections::{HashMap, HashSet};

use memleak_trace::StackRef;

use crate::filter::ResolvedFilter;
use crate::frame_table::FrameTable;
use crate::hash::{int_map, IntMap};
use crate::histogram::{AgeHistogram, SizeCount, SizeHistogram};
use crate::model::{ClassTotals, Frame, OutstandingByClass, SortKey, StackReport};
use crate::replay::{AllocatedTotals, OutstandingBlock, Replay};
use crate::stack_table::StackTable;
use crate::suppress::Suppression;
use crate::verdicts::{
    verdict_rank, BlockContents, ScanIndex, VerdictSet, VerdictTotals, CONTENTS_PER_STACK,
};

/// Outstanding allocations of one stack, while aggregating.
#[derive(Default)]
struct OutstandingByStack {
    bytes: u64,
    count: u64,
    mapped_bytes: u64,
    mapped_count: u64,
    oldest_ts: u64,
    histogram: AgeHistogram,
    verdicts: VerdictTotals,
    /// Lost blocks with contents: (verdict rank, address, scan row), the
    /// first [`CONTENTS_PER_STACK`] in that order.
    samples: Vec<(u8, u64, u32)>,
}

impl OutstandingByStack {
    fn add_sample(&mut self, sample: (u8, u64, u32)) {
        let at = self.samples.partition_point(|s| *s < sample);
        if at < CONTENTS_PER_STACK {
            self.samples.insert(at, sample);
            self.samples.truncate(CONTENTS_PER_STACK);
        }
    }
}

/// How blocks meet the scan's verdicts and the suppressions while they
/// are folded by stack.
pub(crate) struct Join<'a> {
    pub(crate) scan: Option<&'a ScanIndex>,
    pub(crate) verdicts: VerdictSet,
    pub(crate) suppressions: &'a [Suppression],
    /// The first suppression matching each stack, by stack id.
    pub(crate) suppressed_stacks: &'a HashMap<u64, u32>,
    /// A sampled trace's sampling: each heap block counts for the blocks
    /// and bytes it stands for.
    pub(crate) sampling: Option<memleak_trace::Sampling>,
}

/// What [`build_stacks`] returns: the stacks, the totals by class, the
/// totals by verdict before `--verdict`, and what each suppression hid.
pub(crate) type Built = (
    Vec<StackReport>,
    OutstandingByClass,
    VerdictTotals,
    Vec<ClassTotals>,
    SizeHistogram,
);

#[allow(clippy::too_many_arguments)]
/// Without `frames`, the stacks are left without their frames (a
/// caller that keys stacks by their records resolves the few it shows).
pub(crate) fn build_stacks(
    stacks: &StackTable,
    frames: Option<&FrameTable>,
    replayed: &Replay,
    filter: &ResolvedFilter,
    (pids, inherited_for): (&[u32], &HashSet<u32>),
    eval_ts: u64,
    join: &Join<'_>,
) -> Built {
    let n_supps = join.suppressions.len();
    // Aggregate per partition in parallel; a mapping split into pieces by
    // munmap counts once (its pieces all live in partition 0).
    let per_partition = replayed.fold_outstanding(
        || {
            (
                int_map::<u64, OutstandingByStack>(),
                HashSet::<u64>::new(),
                OutstandingByClass::default(),
                (
                    VerdictTotals::default(),
                    vec![ClassTotals::default(); n_supps],
                ),
                SizeHistogram::default(),
            )
        },
        |(acc, mappings, class, (leak, suppressed), sizes), b: &OutstandingBlock| {
            if !filter.outstanding_selected(b.size, b.ts, eval_ts) {
                return;
            }
            if !pids.is_empty() && b.pid.is_some_and(|p| !pids.contains(&p)) {
                return; // an ancestor, replayed only for what it passed on
            }
            if b.inherited && b.pid.is_none_or(|p| !inherited_for.contains(&p)) {
                return;
            }
            // The scan's verdict (None: unscanned), only with a scan.
            let found = join
                .scan
                .and_then(|s| s.lookup(b.pid, b.addr, b.size, b.ts));
            let verdict = found.map(|(v, _)| v);
            // What the block stands for: in a sampled trace, a heap
            // block counts as the blocks and bytes it was sampled from
            // (mappings and kernel blocks are all recorded).
            let (size, blocks) = match join.sampling {
                Some(s) if b.mapping.is_none() && b.pid.is_some() => s.scaled(b.size, b.addr, b.ts),
                _ => (b.size, 1),
            };
            if let Some(&i) = join.suppressed_stacks.get(&b.stack) {
                if join.suppressions[i as usize].applies_to(verdict, b.mapping.is_some()) {
                    let first_piece = b.mapping.is_none_or(|m| mappings.insert(m));
                    suppressed[i as usize].add(size, first_piece as u64 * blocks);
                    return;
                }
            }
            if join.scan.is_some() {
                let first_piece = b.mapping.is_none_or(|m| !mappings.contains(&m));
                leak.add(verdict, b.size, first_piece as u64);
            }
            if !join.verdicts.contains(verdict) {
                if let Some(m) = b.mapping {
                    mappings.insert(m);
                }
                return;
            }
            let first_piece = match b.mapping {
                Some(m) => mappings.insert(m),
                None => true,
            };
            let e = acc.entry(b.stack).or_insert_with(|| OutstandingByStack {
                oldest_ts: u64::MAX,
                ..Default::default()
            });
            let count = first_piece as u64 * blocks;
            match b.mapping {
                Some(_) => sizes.add(b.size, count),
                None => sizes.add_scaled(b.size, count, size),
            }
            if join.scan.is_some() {
                e.verdicts.add(verdict, size, count);
                if let Some((v, row)) = found.filter(|(v, _)| v.is_lost()) {
                    if join.scan.is_some_and(|s| s.has_contents) {
                        e.add_sample((verdict_rank(Some(v)), b.addr, row));
                    }
                }
            }
            e.bytes += size;
            e.count += count;
            if b.mapping.is_some() {
                e.mapped_bytes += size;
                e.mapped_count += count;
            }
            match (b.pid, b.mapping) {
                (None, _) => class.kernel.add(size, count),
                (Some(_), Some(_)) => class.mapped.add(size, count),
                (Some(_), None) => class.heap.add(size, count),
            }
            e.oldest_ts = e.oldest_ts.min(b.ts);
            e.histogram.add(eval_ts.saturating_sub(b.ts), count, size);
        },
    );
    // Merged pairwise on the pool's threads, not one after another.
    use rayon::prelude::*;
    let mut by_class = OutstandingByClass::default();
    let mut outstanding_sizes = SizeHistogram::default();
    let mut leak_totals = VerdictTotals::default();
    let mut suppressed_totals = vec![ClassTotals::default(); n_supps];
    for (_, _, c, (leak, supp), sizes) in &per_partition {
        outstanding_sizes.merge(sizes);
        by_class.heap.add(c.heap.bytes, c.heap.allocations);
        by_class.mapped.add(c.mapped.bytes, c.mapped.allocations);
        by_class.kernel.add(c.kernel.bytes, c.kernel.allocations);
        leak_totals.merge(leak);
        for (t, s) in suppressed_totals.iter_mut().zip(supp) {
            t.add(s.bytes, s.allocations);
        }
    }
    let mut by_stack: IntMap<u64, OutstandingByStack> = per_partition
        .into_par_iter()
        .map(|(part, _, _, _, _)| part)
        .reduce(int_map, |mut a, mut b| {
            if a.len() < b.len() {
                std::mem::swap(&mut a, &mut b);
            }
            for (stack, o) in b {
                match a.get_mut(&stack) {
                    Some(e) => {
                        e.bytes += o.bytes;
                        e.count += o.count;
                        e.mapped_bytes += o.mapped_bytes;
                        e.mapped_count += o.mapped_count;
                        e.oldest_ts = e.oldest_ts.min(o.oldest_ts);
                        e.histogram.merge(&o.histogram);
                        e.verdicts.merge(&o.verdicts);
                        for sample in o.samples {
                            e.add_sample(sample);
                        }
                    }
                    None => {
                        a.insert(stack, o);
                    }
                }
            }
            a
        });
    let allocated: IntMap<u64, AllocatedTotals> = replayed.allocated_by_stack();
    let mut sizes = replayed.allocation_sizes_by_stack();

    // A stack suppressed whatever the verdict is gone from the report;
    // one suppressed for some verdicts only shows what is left.
    let wholly_suppressed = |id: &u64| {
        join.suppressed_stacks.get(id).is_some_and(|&i| {
            let s = &join.suppressions[i as usize];
            s.verdicts.is_all() && s.kind.is_none()
        })
    };
    let ids: std::collections::BTreeSet<u64> = by_stack
        .keys()
        .chain(allocated.keys())
        .filter(|id| !wholly_suppressed(id))
        .copied()
        .collect();
    let ids: Vec<(u64, Option<OutstandingByStack>, Vec<SizeCount>)> = ids
        .into_iter()
        .map(|id| {
            let s = sizes.remove(&id).unwrap_or_default();
            (id, by_stack.remove(&id), s)
        })
        .collect();
    // Resolving frames copies their names: in parallel.
    let out: Vec<StackReport> = ids
        .into_par_iter()
        .map(|(id, o, allocation_sizes)| {
            let a = allocated.get(&id).copied().unwrap_or_default();
            let rec = stacks.get(&id);
            let mut s = StackReport {
                stack_id: id,
                pid: rec.filter(|r| !r.kernel).map(|r| r.pid),
                kernel: rec.is_some_and(|r| r.kernel),
                truncated: rec.is_some_and(|r| r.truncated),
                known: rec.is_some(),
                allocated_bytes: a.bytes,
                allocations: a.allocations,
                temporary: a.temporary,
                allocation_sizes,
                frames: rec
                    .zip(frames)
                    .map(|(r, frames)| resolve_frames(r, frames))
                    .unwrap_or_default(),
                ..Default::default()
            };
            if let Some(o) = o {
                s.bytes = o.bytes;
                s.count = o.count;
                s.mapped_bytes = o.mapped_bytes;
                s.mapped_count = o.mapped_count;
                s.oldest_ts = Some(o.oldest_ts);
                s.oldest_age_ns = eval_ts.saturating_sub(o.oldest_ts);
                s.age_histogram = o.histogram;
                s.contents = o
                    .samples
                    .iter()
                    .filter_map(|&(_, _, row)| {
                        let r = join.scan?.row(row);
                        Some(BlockContents {
                            addr: r.addr,
                            size: r.size,
                            verdict: Some(r.verdict),
                            bytes: r.contents.clone()?,
                        })
                    })
                    .collect();
                s.verdicts = join.scan.map(|_| o.verdicts);
            }
            if join.scan.is_some() && s.verdicts.is_none() {
                s.verdicts = Some(VerdictTotals::default());
            }
            s
        })
        .collect();
    (
        out,
        by_class,
        leak_totals,
        suppressed_totals,
        outstanding_sizes,
    )
}

pub(crate) fn resolve_frames(rec: StackRef<'_>, frames: &FrameTable) -> Vec<Frame> {
    // Kernel frames are symbolized once for all processes, under pid 0.
    let pid = if rec.kernel { 0 } else { rec.pid };
    rec.frames
        .iter()
        .map(|&addr| match frames.get(&(pid, addr)) {
            Some(f) => {
                let f = f.to_record();
                Frame {
                    addr,
                    function: f.function,
                    offset: f.func_offset,
                    file: f.file,
                    line: f.line,
                    column: f.column,
                    path: f.path,
                    file_offset: f.file_offset,
                    build_id: f.build_id,
                    inlined: f.inlined,
                }
            }
            None => Frame {
                addr,
                ..Default::default()
            },
        })
        .collect()
}

/// Sorts the stacks of a report with verdicts: leaking stacks grouped by
/// their worst verdict (definitely lost first, unscanned last), each group
/// by `key` applied to the bytes and count of that verdict, then as
/// [`sort_stacks`] does.
pub fn sort_stacks_by_verdict(stacks: &mut [StackReport], key: SortKey) {
    let worst = |s: &StackReport| {
        let (v, t) = s
            .verdicts
            .and_then(|v| v.worst())
            .unwrap_or((None, ClassTotals::default()));
        (verdict_rank(v), t)
    };
    stacks.sort_unstable_by(|a, b| {
        let leak = b.shown(key).cmp(&a.shown(key));
        let ((ra, ta), (rb, tb)) = (worst(a), worst(b));
        let by_key = match key {
            SortKey::Growth => {
                crate::growth::order((a.growth.as_ref(), a.bytes), (b.growth.as_ref(), b.bytes))
            }
            SortKey::Temporary => b
                .temporary
                .cmp(&a.temporary)
                .then(b.allocations.cmp(&a.allocations)),
            SortKey::Bytes | SortKey::Verdict => tb
                .bytes
                .cmp(&ta.bytes)
                .then(tb.allocations.cmp(&ta.allocations)),
            SortKey::Count => tb
                .allocations
                .cmp(&ta.allocations)
                .then(tb.bytes.cmp(&ta.bytes)),
            SortKey::Age => b
                .oldest_age_ns
                .cmp(&a.oldest_age_ns)
                .then(b.bytes.cmp(&a.bytes)),
        };
        leak.then(ra.cmp(&rb))
            .then(by_key)
            .then(b.bytes.cmp(&a.bytes))
            .then(b.allocated_bytes.cmp(&a.allocated_bytes))
            .then(a.stack_id.cmp(&b.stack_id))
    });
}

/// Sorts leaking stacks by `key` (ties by stack id, so output is stable),
/// then stacks with nothing outstanding by bytes allocated. Stack ids are
/// unique, so no two stacks compare equal and an unstable sort (which
/// moves the large reports less) gives the same order.
pub fn sort_stacks(stacks: &mut [StackReport], key: SortKey) {
    stacks.sort_unstable_by(|a, b| {
        let leak = b.shown(key).cmp(&a.shown(key));
        let by_key = match key {
            SortKey::Growth => {
                crate::growth::order((a.growth.as_ref(), a.bytes), (b.growth.as_ref(), b.bytes))
            }
            SortKey::Bytes | SortKey::Verdict => b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)),
            SortKey::Count => b.count.cmp(&a.count).then(b.bytes.cmp(&a.bytes)),
            SortKey::Age => b
                .oldest_age_ns
                .cmp(&a.oldest_age_ns)
                .then(b.bytes.cmp(&a.bytes)),
            SortKey::Temporary => b
                .temporary
                .cmp(&a.temporary)
                .then(b.allocations.cmp(&a.allocations))
                .then(b.bytes.cmp(&a.bytes)),
        };
        leak.then(by_key)
            .then(b.allocated_bytes.cmp(&a.allocated_bytes))
            .then(a.stack_id.cmp(&b.stack_id))
    });
}
