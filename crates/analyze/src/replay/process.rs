//! What a partition keeps per process: its [`PidState`] (the blocks and
//! mappings it holds, and those it no longer holds but that stay
//! outstanding), the pids and slots kept for the kernel, and the
//! [`ProcessIndex`] that numbers processes the same in every partition.

use std::sync::Mutex;

use super::counts::Counts;
use crate::hash::IntMap;
use crate::ranges::RangeSet;
use crate::table::{Block, BlockTable};

/// A new peak: out of line, so the test before it stays a branch (taken
/// rarely once the peak is reached) rather than conditional moves of
/// values the loop keeps in memory.
#[cold]
#[inline(never)]
pub(super) fn raise(peak: &mut i64, peak_ts: &mut u64, value: i64, ts: u64) {
    *peak = value;
    *peak_ts = ts;
}

/// Kernel slab and per-CPU allocations share one address space, keyed by
/// address alone. Pages are keyed by page frame number, which is not an
/// address, so they get a namespace of their own.
pub(super) const KERNEL_PID: u32 = u32::MAX;
pub(super) const PAGE_PID: u32 = u32::MAX - 1;
pub(super) const KERNEL_SLOT: usize = 0;
pub(super) const PAGE_SLOT: usize = 1;
/// No slot: a process the pid cache did not hold (see
/// [`Partition::known_slot`](super::partition::Partition::known_slot)).
pub(super) const UNKNOWN_SLOT: usize = usize::MAX;
/// Never a real pid (Linux pids stay below 2^22).
pub(super) const NO_PID: u32 = u32::MAX - 2;

/// The state of one process (or kernel namespace) in one partition.
///
/// Its outstanding blocks and mappings are split in two disjoint sets:
/// those the process holds while it runs (`blocks`, `ranges`), which
/// count in the live total the peak follows, and those it no longer holds
/// (`gone`) but that are still outstanding, so reported: the blocks it
/// had when it exited (its memory went back to the system, but they were
/// never freed: leaks), and the copy of its parent's heap it inherited at
/// fork (counted for the parent). Together they are what a single table
/// of the process would hold: a free or an allocation that misses
/// `blocks` looks in `gone` (a cold path, taken only once a process has
/// a `gone`).
pub(super) struct PidState {
    pub(super) pid: u32,
    /// Its number in the [`ProcessIndex`] ([`NO_PROCESS`] for the
    /// kernel's).
    pub(super) process: u32,
    pub(super) blocks: BlockTable,
    /// Only partition 0 has mappings.
    pub(super) ranges: RangeSet,
    /// Outstanding, but no longer counted in the live total.
    pub(super) gone: Option<Box<Gone>>,
    /// Bytes of `blocks` and `ranges`: what the process counts for in
    /// the live total.
    pub(super) held: i64,
    /// The peak of `held` and when it was first reached: the process's
    /// peak with a single partition (several partitions each hold a part,
    /// and the sequential pass sums them).
    pub(super) peak: i64,
    pub(super) peak_ts: u64,
    /// When the process was forked in the trace (0: not seen forked).
    /// Its blocks from before then are the copies of its parent's that it
    /// inherited ([`OutstandingBlock::inherited`](super::OutstandingBlock::inherited)).
    pub(super) born_ts: u64,
    /// Whether its allocations count in the growth samples, and whether
    /// its inherited copies do ([`Sampler::counts_pid`](super::samples::Sampler::counts_pid)).
    pub(super) sampled: (bool, bool),
}

/// Outstanding blocks and mappings of a process that no longer count in
/// the live total (see [`PidState`]).
#[derive(Clone, Default)]
pub(super) struct Gone {
    pub(super) blocks: BlockTable,
    pub(super) ranges: RangeSet,
}

impl Gone {
    pub(super) fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.ranges.is_empty()
    }

    /// Adds `blocks` and `ranges`, disjoint from what it holds.
    fn absorb(&mut self, blocks: BlockTable, ranges: RangeSet) {
        if blocks.len() > self.blocks.len() {
            let mine = std::mem::replace(&mut self.blocks, blocks);
            for (addr, b) in mine.iter() {
                self.blocks.insert(addr, b);
            }
        } else {
            for (addr, b) in blocks.iter() {
                self.blocks.insert(addr, b);
            }
        }
        for (start, r) in ranges.iter() {
            self.ranges.insert(start, *r);
        }
    }
}

impl PidState {
    pub(super) fn new(pid: u32, process: u32) -> Self {
        PidState {
            pid,
            process,
            blocks: BlockTable::default(),
            ranges: RangeSet::default(),
            gone: None,
            held: 0,
            peak: 0,
            peak_ts: 0,
            born_ts: 0,
            sampled: (false, false),
        }
    }

    /// The process no longer holds its blocks and mappings (it exited):
    /// they stay outstanding, in `gone`. `held` is left to the caller,
    /// which emits the change.
    pub(super) fn retire(&mut self) {
        if self.blocks.is_empty() && self.ranges.is_empty() {
            return;
        }
        let blocks = std::mem::take(&mut self.blocks);
        let ranges = std::mem::take(&mut self.ranges);
        match &mut self.gone {
            Some(g) => g.absorb(blocks, ranges),
            None => self.gone = Some(Box::new(Gone { blocks, ranges })),
        }
    }

    /// Forgets an empty `gone`, so allocations stop looking in it.
    pub(super) fn drop_empty_gone(&mut self) {
        if self.gone.as_ref().is_some_and(|g| g.is_empty()) {
            self.gone = None;
        }
    }

    /// A copy of everything outstanding in the process, held or not: what
    /// a child inherits at fork.
    pub(super) fn copy_all(&self) -> Gone {
        let mut copy = Gone {
            blocks: self.blocks.clone(),
            ranges: self.ranges.clone(),
        };
        if let Some(g) = &self.gone {
            copy.absorb(g.blocks.clone(), g.ranges.clone());
        }
        copy
    }
}

/// In [`Partition::deltas`](super::partition::Partition::deltas): a change that belongs to no process (the
/// kernel's, or a pid replay keeps for itself).
pub(super) const NO_PROCESS: u32 = 0;

/// Numbers the processes of a replay from 1, the same in every partition,
/// so the sequential pass finds a process's share by index. A partition
/// asks once per process, when it first meets it.
#[derive(Clone, Default)]
pub(super) struct ProcessIndex(std::sync::Arc<Mutex<Numbers>>);

/// The numbers of [`ProcessIndex`]: by pid, and the pids in order.
#[derive(Default)]
struct Numbers {
    of: IntMap<u32, u32>,
    pids: Vec<u32>,
}

impl ProcessIndex {
    /// The number of `pid`; [`NO_PROCESS`] for the pids replay keeps for
    /// the kernel (and a process whose pid collides with them).
    pub(super) fn of(&self, pid: u32) -> u32 {
        if pid >= NO_PID {
            return NO_PROCESS;
        }
        let mut g = crate::pool::lock_pool(&self.0);
        let Numbers { of, pids } = &mut *g;
        *of.entry(pid).or_insert_with(|| {
            pids.push(pid);
            pids.len() as u32
        })
    }

    /// How many processes have a number.
    pub(super) fn len(&self) -> usize {
        crate::pool::lock_pool(&self.0).pids.len()
    }

    /// The pids, by number less 1.
    pub(super) fn pids(&self) -> Vec<u32> {
        crate::pool::lock_pool(&self.0).pids.clone()
    }
}

/// An allocation at `addr` in a process with blocks it no longer holds:
/// one of them at that address was never freed (a missed free). It did
/// not count in the live total: nothing to take off. Returns the block
/// it replaced.
#[cold]
#[inline(never)]
pub(super) fn replace_gone(st: &mut PidState, counts: &mut Counts, addr: u64) -> Option<Block> {
    let mut old = None;
    if let Some(g) = &mut st.gone {
        old = g.blocks.remove(addr);
        if old.is_some() {
            counts.anomalies.missed_frees += 1;
        }
    }
    st.drop_empty_gone();
    old
}

/// Frees the block at `addr` among those the process no longer holds, if
/// it is there: it leaves the report, but the live total did not count
/// it. Returns the block.
#[cold]
#[inline(never)]
pub(super) fn free_gone(st: &mut PidState, counts: &mut Counts, addr: u64) -> Option<Block> {
    let b = st.gone.as_mut()?.blocks.remove(addr)?;
    counts.frees += 1;
    counts.freed_bytes += b.size;
    st.drop_empty_gone();
    Some(b)
}
