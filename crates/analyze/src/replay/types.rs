//! The public types of a replay: how to replay ([`ReplayOptions`]), and
//! what it leaves ([`Replay`]: the outstanding blocks, and the totals,
//! [`ReplayStats`]).

use std::collections::BTreeMap;

use memleak_trace::EventKind;
use rayon::prelude::*;

use super::allocated::{Allocated, AllocatedTotals};
use super::counts::Anomalies;
use super::partition::Partition;
use super::process::{PidState, PAGE_PID};
use super::samples::{GrowthPlan, Row};
use crate::filter::ResolvedFilter;
use crate::hash::{int_map, IntMap};
use crate::table::BlockTable;

/// Default of `--temporary-threshold`: 1 ms.
pub const DEFAULT_TEMPORARY_NS: u64 = 1_000_000;

/// How to replay.
#[derive(Default)]
pub struct ReplayOptions<'a> {
    /// Which events and allocations count.
    pub filter: ResolvedFilter,
    /// Stop at this timestamp (inclusive); `None` replays everything.
    pub at_ts: Option<u64>,
    /// Stop after this row of the events table (counted from 0 over the
    /// whole trace), as well: events that share a timestamp are told
    /// apart by their order.
    pub at_row: Option<u64>,
    /// Number of partitions; 0 means one per two rayon threads (at least
    /// one): see [`default_partitions`](super::default_partitions).
    pub partitions: usize,
    /// Called with the number of rows replayed after each row group.
    pub progress: Option<&'a (dyn Fn(u64) + Sync)>,
    /// Highest stack id of the trace, if the caller read the stacks
    /// already (replay sizes per-stack arrays by it).
    pub max_stack_id: Option<u64>,
    /// Sample outstanding bytes by stack over time, for the growth
    /// verdicts; `None` samples nothing.
    pub growth: Option<GrowthPlan>,
    /// An allocation freed no later than this (ns) after it was made may
    /// be temporary (`replay/temporary.rs`); 0 means the default
    /// ([`DEFAULT_TEMPORARY_NS`](DEFAULT_TEMPORARY_NS)).
    pub temporary_ns: u64,
    /// A sampled trace's sampling (meta.json): the allocations, frees and
    /// live total count each heap block for what it stands for.
    pub sampling: Option<memleak_trace::Sampling>,
}

/// An outstanding allocation as the report sees it: a heap block or a
/// piece of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutstandingBlock {
    /// Owning process; `None` for kernel allocations.
    pub pid: Option<u32>,
    /// Start address (page frame number for kernel pages).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// When it was allocated.
    pub ts: u64,
    /// Stack of the allocation (0: unknown).
    pub stack: u64,
    /// For a piece of a mapping: id of the mapping, shared by the pieces a
    /// partial munmap left, so they count as one allocation.
    pub mapping: Option<u64>,
    /// A forked process's copy of a block its parent allocated before the
    /// fork (allocated before the process was born). The parent reports
    /// the block (or dropped it at exec); the copy is the child's only
    /// when the child is looked at without its parent (`--pid CHILD`).
    pub inherited: bool,
}

/// Totals of a replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Events read (up to the `at` cutoff), before filters, by kind.
    pub events_by_kind: BTreeMap<EventKind, u64>,
    /// Timestamp of the first event read.
    pub first_ts: Option<u64>,
    /// Timestamp of the last event read.
    pub last_ts: Option<u64>,
    /// Allocations replayed (realloc and mremap count as a free and an
    /// allocation; mmap counts as an allocation).
    pub allocations: u64,
    /// Frees that released a tracked block (or part of a mapping).
    pub frees: u64,
    /// Bytes allocated.
    pub allocated_bytes: u64,
    /// Bytes released by frees.
    pub freed_bytes: u64,
    /// Of `allocations`, those the filter selects that were temporary.
    pub temporary: u64,
    /// Anomalies.
    pub anomalies: Anomalies,
    /// Highest live total: outstanding bytes of the processes alive at
    /// the time, and of the kernel (see [the replay module](super)).
    pub peak_bytes: u64,
    /// When it was reached (0 if never).
    pub peak_ts: u64,
    /// The row of the events table that reached it, counted from 0 over
    /// the whole trace: known with several partitions only (`None` with
    /// one, or if never reached).
    pub peak_row: Option<u64>,
    /// The live total at the end of replay.
    pub live_bytes: u64,
    /// The peak of each process's share of the live total, by pid, for
    /// the processes that held any.
    pub process_peaks: Vec<ProcessPeak>,
}

/// The highest share of the live total one process held: the bytes it
/// had allocated (in its current program image; not the copy of its
/// parent's heap it got at fork) and not freed, while it was alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessPeak {
    /// Process id.
    pub pid: u32,
    /// Bytes.
    pub bytes: u64,
    /// When they were first reached.
    pub ts: u64,
    /// The row that reached them, as [`ReplayStats::peak_row`].
    pub row: Option<u64>,
}

impl ReplayStats {
    /// Events read, all kinds.
    pub fn events(&self) -> u64 {
        self.events_by_kind.values().sum()
    }
}

/// What a replay leaves: the outstanding state and the totals.
pub struct Replay {
    pub(super) partitions: Vec<Partition>,
    /// Allocations counted while decoding.
    pub(super) allocated: Allocated,
    pub(super) stats: ReplayStats,
    pub(super) growth: Option<GrowthSamples>,
}

/// Outstanding bytes at the end of each window of a [`GrowthPlan`]: by
/// stack (the stacks that held any at some window's end), and in all.
#[derive(Debug, Default)]
pub(crate) struct GrowthSamples {
    pub(crate) rows: IntMap<u64, Row>,
    pub(crate) totals: Vec<u64>,
}

impl Replay {
    /// Totals of the replay.
    pub fn stats(&self) -> &ReplayStats {
        &self.stats
    }

    /// The growth samples, if the options asked for them; once.
    pub(crate) fn take_growth(&mut self) -> Option<GrowthSamples> {
        self.growth.take()
    }

    /// Folds every outstanding allocation, in parallel: the blocks of
    /// each table in pieces of `FOLD_SLOTS` slots, one accumulator per
    /// piece, and the pieces of mappings of each partition into one
    /// accumulator (with its mapping id, a piece of a mapping split by
    /// munmap can be told from another piece of the same mapping).
    pub fn fold_outstanding<T: Send>(
        &self,
        init: impl Fn() -> T + Sync,
        fold: impl Fn(&mut T, &OutstandingBlock) + Sync,
    ) -> Vec<T> {
        fold_partitions(&self.partitions, init, fold)
    }

    /// The sizes of the allocations the filter selects.
    pub fn allocation_sizes(&self) -> &crate::histogram::SizeHistogram {
        &self.allocated.sizes
    }

    /// The sizes of each stack's allocations the filter selects, as
    /// non-empty buckets, smallest first.
    pub fn allocation_sizes_by_stack(&self) -> IntMap<u64, Vec<crate::histogram::SizeCount>> {
        self.allocated.sizes_by_stack()
    }

    /// Allocations made by each stack during replay (freed or not), among
    /// those the filter selects.
    pub fn allocated_by_stack(&self) -> IntMap<u64, AllocatedTotals> {
        let mut out: IntMap<u64, AllocatedTotals> = int_map();
        self.allocated.totals.for_each(|stack, t| {
            out.insert(stack, *t);
        });
        out
    }
}

/// Slots of a block table folded by one task of
/// [`Replay::fold_outstanding`] (2 MiB).
const FOLD_SLOTS: usize = 1 << 16;

/// [`Replay::fold_outstanding`] over the partitions of a replay, finished
/// or still going (`LiveReplay`).
pub(super) fn fold_partitions<T: Send>(
    partitions: &[Partition],
    init: impl Fn() -> T + Sync,
    fold: impl Fn(&mut T, &OutstandingBlock) + Sync,
) -> Vec<T> {
    let pid_of = |st: &PidState| {
        if st.pid >= PAGE_PID {
            None
        } else {
            Some(st.pid)
        }
    };
    // The blocks a process holds, and those it no longer holds.
    fn table(st: &PidState, gone: bool) -> Option<&BlockTable> {
        match gone {
            false => Some(&st.blocks),
            true => st.gone.as_ref().map(|g| &g.blocks),
        }
    }
    // (partition, state, whether its `gone` table, piece);
    // `usize::MAX` for the mappings.
    let mut work = Vec::new();
    for (i, p) in partitions.iter().enumerate() {
        work.push((i, usize::MAX, false, 0));
        for (s, st) in p.pids.iter().enumerate() {
            for gone in [false, true] {
                if let Some(t) = table(st, gone) {
                    for piece in 0..t.pieces(FOLD_SLOTS) {
                        work.push((i, s, gone, piece));
                    }
                }
            }
        }
    }
    work.par_iter()
        .map(|&(i, s, gone, piece)| {
            let mut acc = init();
            let p = &partitions[i];
            if s != usize::MAX {
                let st = &p.pids[s];
                let pid = pid_of(st);
                let t = table(st, gone).expect("listed above");
                for (addr, b) in t.piece(piece, FOLD_SLOTS) {
                    let o = OutstandingBlock {
                        pid,
                        addr,
                        size: b.size,
                        ts: b.ts,
                        stack: b.stack,
                        mapping: None,
                        inherited: b.ts < st.born_ts,
                    };
                    fold(&mut acc, &o);
                }
                return acc;
            }
            for st in &p.pids {
                let pid = pid_of(st);
                let gone = st.gone.as_ref().map(|g| g.ranges.iter());
                for (start, r) in st.ranges.iter().chain(gone.into_iter().flatten()) {
                    let o = OutstandingBlock {
                        pid,
                        addr: start,
                        size: r.end - start,
                        ts: r.ts,
                        stack: r.stack,
                        mapping: Some(r.origin),
                        inherited: r.ts < st.born_ts,
                    };
                    fold(&mut acc, &o);
                }
            }
            acc
        })
        .collect()
}
