//! A partition: the outstanding state of the addresses one hash range
//! owns, and its two replay engines, [`Partition::replay_packed`] for a
//! single partition streaming [`Packed`] operations, and
//! [`Partition::replay_batch`] for several, each replaying the rows it
//! was given of a decoded row group.

use super::counts::Counts;
use super::ctx::{
    realloc_frees, Ctx, Op, C_ALLOC_KERNEL, C_ALLOC_PAGE, C_ALLOC_USER, C_FREE_KERNEL, C_FREE_PAGE,
    C_FREE_USER, USER_TABLE,
};
use super::packed::{Packed, PackedOp, CODE_SHIFT, SIZE_BITS};
use super::process::{
    free_gone, raise, replace_gone, PidState, ProcessIndex, KERNEL_PID, KERNEL_SLOT, NO_PID,
    NO_PROCESS, PAGE_PID, PAGE_SLOT, UNKNOWN_SLOT,
};
use super::samples::Sampler;
use crate::hash::{int_map, mix, IntMap};
use crate::ranges::{RangeSet, Region};
use crate::table::{Block, BlockTable};
use memleak_trace::events::Slices;

/// Slots of the recent-frees cache (a power of two). 4 K entries of 8
/// bytes stay in L1/L2; a double free usually follows the first free
/// closely.
const RECENT_FREES: usize = 1 << 12;
/// Slots of the direct-mapped pid → state cache.
const PID_CACHE: usize = 64;
/// How many rows (or packed operations) ahead replay prefetches table
/// slots: enough to cover a memory latency with the work of the rows in
/// between.
const AHEAD: usize = 12;
/// The ring of hashes of the operations between replay and its
/// prefetches (a power of two above [`AHEAD`]).
const HASHES: usize = 16;

pub(super) struct Partition {
    pub(super) index: usize,
    processes: ProcessIndex,
    pub(super) pids: Vec<PidState>,
    slot_of: IntMap<u32, usize>,
    /// Direct-mapped cache of `slot_of`: events of several processes
    /// interleave, so a last-used entry would miss.
    pid_cache: [(u32, u32); PID_CACHE],
    /// Fingerprints of recently freed (namespace, address) pairs.
    recent_frees: Box<[u64]>,
    pub(super) counts: Counts,
    /// Changes of the live total this partition made in the current row
    /// group: (row, number of the process whose holdings changed, delta),
    /// in row order.
    /// Each partition keeps its own so no two threads write the same
    /// cache line.
    pub(super) deltas: Vec<(u32, u32, i64)>,
    /// With a single partition, which lists no changes: the live total
    /// (bytes outstanding in processes alive, and in the kernel), its
    /// peak and when it was reached.
    pub(super) outstanding: i64,
    pub(super) peak: i64,
    pub(super) peak_ts: u64,
    next_mapping: u64,
    /// Outstanding bytes by stack, sampled for the growth verdicts.
    pub(super) sampler: Sampler,
    /// A sampled trace's sampling: frees and the live total count each
    /// heap block for the bytes and blocks it stands for.
    pub(super) sampling: Option<memleak_trace::Sampling>,
}

/// What heap block `b` at `addr` of process `pid` counts for, (bytes,
/// blocks): itself, or in a sampled trace what it stands for (kernel
/// blocks are never sampled).
#[inline(always)]
fn weigh(sampling: Option<memleak_trace::Sampling>, pid: u32, addr: u64, b: &Block) -> (u64, u64) {
    match sampling {
        Some(s) if pid < PAGE_PID => s.scaled(b.size, addr, b.ts),
        _ => (b.size, 1),
    }
}

impl Partition {
    pub(super) fn new(index: usize, processes: &ProcessIndex, sampler: Sampler) -> Self {
        let mut p = Partition {
            index,
            processes: processes.clone(),
            pids: vec![
                PidState::new(KERNEL_PID, NO_PROCESS),
                PidState::new(PAGE_PID, NO_PROCESS),
            ],
            slot_of: int_map(),
            pid_cache: [(NO_PID, 0); PID_CACHE],
            recent_frees: vec![0; RECENT_FREES].into_boxed_slice(),
            counts: Counts::default(),
            deltas: Vec::new(),
            outstanding: 0,
            peak: 0,
            peak_ts: 0,
            next_mapping: 1,
            sampler,
            sampling: None,
        };
        for st in &mut p.pids {
            st.sampled = p.sampler.counts_pid(None);
        }
        p
    }

    #[inline(always)]
    fn peek_slot(&self, pid: u32) -> Option<usize> {
        let (p, s) = self.pid_cache[pid as usize % PID_CACHE];
        (p == pid).then_some(s as usize)
    }

    #[inline(always)]
    fn slot(&mut self, pid: u32) -> usize {
        match self.peek_slot(pid) {
            Some(s) => s,
            None => self.slot_slow(pid),
        }
    }

    #[cold]
    fn slot_slow(&mut self, pid: u32) -> usize {
        let slot = match self.slot_of.get(&pid) {
            Some(&s) => s,
            None => {
                let process = self.processes.of(pid);
                let mut st = PidState::new(pid, process);
                st.sampled = self.sampler.counts_pid(Some(pid));
                self.pids.push(st);
                self.slot_of.insert(pid, self.pids.len() - 1);
                self.pids.len() - 1
            }
        };
        self.pid_cache[pid as usize % PID_CACHE] = (pid, slot as u32);
        slot
    }

    /// Allocates a block in the table of `slot` and counts it in what
    /// the process holds (and its peak); returns the change of the live
    /// total.
    #[inline(always)]
    fn alloc<const ALONE: bool>(
        &mut self,
        slot: usize,
        addr: u64,
        size: u64,
        ts: u64,
        stack: u64,
    ) -> i64 {
        self.alloc_hashed::<ALONE>(slot, addr, mix(addr), Block { size, ts, stack })
    }

    /// [`Partition::alloc`] with `h` = [`mix`]`(addr)` already known. A
    /// single partition (`ALONE`) follows the process's peak too.
    #[inline(always)]
    fn alloc_hashed<const ALONE: bool>(&mut self, slot: usize, addr: u64, h: u64, b: Block) -> i64 {
        let ts = b.ts;
        let size = weigh(self.sampling, self.pids[slot].pid, addr, &b).0;
        let sampling = self.sampling;
        let st = &mut self.pids[slot];
        let sampler = &mut self.sampler;
        sampler.count(&b, st.sampled, st.born_ts, 1);
        let d = match st.blocks.insert_hashed(addr, h, b) {
            None => {
                if st.gone.is_some() {
                    if let Some(old) = replace_gone(st, &mut self.counts, addr) {
                        sampler.count(&old, st.sampled, st.born_ts, -1);
                    }
                }
                size as i64
            }
            Some(old) => {
                self.counts.anomalies.missed_frees += 1;
                sampler.count(&old, st.sampled, st.born_ts, -1);
                size as i64 - weigh(sampling, st.pid, addr, &old).0 as i64
            }
        };
        st.held += d;
        if ALONE && st.held > st.peak {
            raise(&mut st.peak, &mut st.peak_ts, st.held, ts);
        }
        d
    }

    /// Frees a block of the table of `slot` (or of what the process no
    /// longer holds); returns the change of the live total, also taken
    /// off what the process holds.
    #[inline(always)]
    fn free(&mut self, slot: usize, addr: u64) -> i64 {
        self.free_hashed(slot, addr, mix(addr))
    }

    /// [`Partition::free`] with `h` = [`mix`]`(addr)` already known.
    #[inline(always)]
    fn free_hashed(&mut self, slot: usize, addr: u64, h: u64) -> i64 {
        let st = &mut self.pids[slot];
        let fp = (h ^ ((st.pid as u64) << 32)) | 1;
        let cached = &mut self.recent_frees[h as usize & (RECENT_FREES - 1)];
        let hit = *cached == fp;
        *cached = fp;
        let d = match st.blocks.remove_hashed(addr, h) {
            Some(b) => {
                let (bytes, blocks) = weigh(self.sampling, st.pid, addr, &b);
                self.counts.frees += blocks;
                self.counts.freed_bytes += bytes;
                self.sampler.count(&b, st.sampled, st.born_ts, -1);
                -(bytes as i64)
            }
            None => {
                if st.gone.is_some() {
                    if let Some(b) = free_gone(st, &mut self.counts, addr) {
                        self.sampler.count(&b, st.sampled, st.born_ts, -1);
                        return 0;
                    }
                }
                if hit {
                    self.counts.anomalies.double_frees += 1;
                } else {
                    self.counts.anomalies.unknown_frees += 1;
                }
                0
            }
        };
        st.held += d;
        d
    }

    /// Adds `d`, made at `ts`, to what the process (or kernel namespace)
    /// of `slot` holds, for the changes that are no allocation or free of
    /// a block (which [`Partition::alloc`] and [`Partition::free`] count).
    fn hold(&mut self, slot: usize, d: i64, ts: u64) {
        let st = &mut self.pids[slot];
        st.held += d;
        if st.held > st.peak {
            st.peak = st.held;
            st.peak_ts = ts;
        }
    }

    /// Records a change `d` of the live total at row `i`, made at `ts` to
    /// what the process (or kernel namespace) of `slot` holds: a single
    /// partition (`ALONE`) follows the peak itself; several list their
    /// changes for the sequential pass that sums them (and follows each
    /// process's peak).
    #[inline(always)]
    fn emit<const ALONE: bool>(&mut self, i: usize, slot: usize, d: i64, ts: u64) {
        if ALONE {
            self.outstanding += d;
            if self.outstanding > self.peak {
                self.peak = self.outstanding;
                self.peak_ts = ts;
            }
        } else if d != 0 {
            self.deltas.push((i as u32, self.pids[slot].process, d));
        }
    }

    /// Prefetches what row `j` will touch: the home slots of its address
    /// and old address. Branch-free on the kind (a branch on it would
    /// mispredict as often as the replay's own dispatch); a row that needs
    /// none of it (or that another partition owns) costs a useless
    /// prefetch, not a stall. The recent-frees cache (32 KiB) stays in
    /// cache by itself: prefetching its entries too made replay about 7%
    /// slower, the prefetches queueing behind the table's misses.
    #[inline(always)]
    fn prefetch_row(&self, b: &Slices<'_>, j: usize, ctx: &Ctx<'_>) {
        let table = self.table_for(b.kind[j], b.pid[j], ctx);
        table.prefetch(b.addr[j]);
        let old = b.old_addr[j];
        if old != 0 {
            table.prefetch(old);
        }
    }

    /// The table a row of `kind` (or an operation of that code) of `pid`
    /// uses, as far as the pid cache knows it without a miss (else the
    /// kernel's: only for prefetching).
    #[inline(always)]
    fn table_for(&self, kind: u8, pid: u32, ctx: &Ctx<'_>) -> &BlockTable {
        let fixed = ctx.table_of[kind as usize] as usize;
        let (p, s) = self.pid_cache[pid as usize % PID_CACHE];
        let user = if p == pid { s as usize } else { KERNEL_SLOT };
        let slot = if fixed == USER_TABLE { user } else { fixed };
        &self.pids[slot].blocks
    }

    /// The slot a row of `kind` (or an operation of that code) of `pid`
    /// uses, as far as the pid cache knows it without a miss:
    /// [`UNKNOWN_SLOT`] for a process the cache does not hold. A slot
    /// found stays right: a process keeps its slot for the whole replay.
    #[inline(always)]
    fn known_slot(&self, kind: u8, pid: u32, ctx: &Ctx<'_>) -> usize {
        let fixed = ctx.table_of[kind as usize] as usize;
        let (p, s) = self.pid_cache[pid as usize % PID_CACHE];
        let user = if p == pid { s as usize } else { UNKNOWN_SLOT };
        if fixed == USER_TABLE {
            user
        } else {
            fixed
        }
    }

    /// Replays a row group's [`Packed`] operations (single partition
    /// only).
    pub(super) fn replay_packed(&mut self, packed: &Packed, ctx: &Ctx<'_>) {
        let ops = &packed.ops[..];
        let count = ops.len();
        // The hash of each address, and the slot of its table as far as
        // the pid cache knew it, found once when its operation is
        // prefetched and kept until it is replayed.
        let mut hashes = [(0u64, 0usize); HASHES];
        let prefetch = |p: &Self, o: &PackedOp| -> (u64, usize) {
            let code = (o.size_code >> CODE_SHIFT) as u8;
            let h = mix(o.addr);
            let slot = p.known_slot(code, o.pid, ctx);
            let table = match slot {
                UNKNOWN_SLOT => KERNEL_SLOT,
                s => s,
            };
            p.pids[table].blocks.prefetch_hash(h);
            (h, slot)
        };
        for (k, o) in ops[..AHEAD.min(count)].iter().enumerate() {
            hashes[k] = prefetch(self, o);
        }
        // Outstanding bytes and their peak, as emit::<true> follows them,
        // in locals: the table calls would otherwise make the compiler
        // load and store them for every operation.
        let (mut outstanding, mut peak, mut peak_ts) = (self.outstanding, self.peak, self.peak_ts);
        for i in 0..count {
            if i + AHEAD < count {
                hashes[(i + AHEAD) % HASHES] = prefetch(self, &ops[i + AHEAD]);
            }
            let o = ops[i];
            self.sampler.tick(o.ts);
            let (h, known) = hashes[i % HASHES];
            // The kernel's and the pages' slots are fixed: only a user
            // operation can find its slot unknown.
            let slot = |p: &mut Self| match known {
                UNKNOWN_SLOT => p.slot(o.pid),
                s => s,
            };
            let c = (o.size_code >> CODE_SHIFT) as u8;
            match c {
                C_ALLOC_USER | C_ALLOC_KERNEL | C_ALLOC_PAGE => {
                    let slot = slot(self);
                    let b = Block {
                        size: o.size_code & SIZE_BITS,
                        ts: o.ts,
                        stack: o.stack as u64,
                    };
                    outstanding += self.alloc_hashed::<true>(slot, o.addr, h, b);
                    if outstanding > peak {
                        raise(&mut peak, &mut peak_ts, outstanding, o.ts);
                    }
                }
                C_FREE_USER | C_FREE_KERNEL | C_FREE_PAGE => {
                    let slot = slot(self);
                    // A free never raises the total: no new peak.
                    outstanding += self.free_hashed(slot, o.addr, h);
                }
                _ => {
                    (self.outstanding, self.peak, self.peak_ts) = (outstanding, peak, peak_ts);
                    let row = &packed.rows[o.addr as usize];
                    self.replay_row::<true>(&row.slices(), 0, ctx);
                    (outstanding, peak, peak_ts) = (self.outstanding, self.peak, self.peak_ts);
                }
            }
        }
        (self.outstanding, self.peak, self.peak_ts) = (outstanding, peak, peak_ts);
    }

    /// Replays the rows of a row group that `split_rows` listed for this
    /// partition, in order (with several partitions; a single one replays
    /// by [`Partition::replay_packed`]).
    pub(super) fn replay_batch(&mut self, b: Slices<'_>, rows: &[u32], ctx: &Ctx<'_>) {
        let count = rows.len();
        for &r in &rows[..AHEAD.min(count)] {
            self.prefetch_row(&b, r as usize, ctx);
        }
        for k in 0..count {
            if k + AHEAD < count {
                self.prefetch_row(&b, rows[k + AHEAD] as usize, ctx);
            }
            self.replay_row::<false>(&b, rows[k] as usize, ctx);
        }
    }

    /// Replays row `i` of a row group.
    #[inline(always)]
    fn replay_row<const ALONE: bool>(&mut self, b: &Slices<'_>, i: usize, ctx: &Ctx<'_>) {
        let p = self.index;
        let (kinds, addrs, sizes) = (b.kind, b.addr, b.size);
        let (ts, pids, stacks, olds) = (b.ts, b.pid, b.stack_id, b.old_addr);
        let kind = kinds[i];
        self.sampler.tick(ts[i]);
        match ctx.ops[kind as usize] {
            // `split_rows` gave this partition only the allocations and
            // frees of addresses it owns.
            op @ (Op::Alloc | Op::KernelAlloc | Op::PageAlloc) => {
                let a = addrs[i];
                if a == 0 || !ctx.selected(kind, pids[i]) {
                    return;
                }
                let slot = match op {
                    Op::Alloc => self.slot(pids[i]),
                    Op::KernelAlloc => KERNEL_SLOT,
                    _ => PAGE_SLOT,
                };
                let d = self.alloc::<ALONE>(slot, a, sizes[i], ts[i], stacks[i]);
                self.emit::<ALONE>(i, slot, d, ts[i]);
            }
            op @ (Op::Free | Op::KernelFree | Op::PageFree) => {
                let a = addrs[i];
                if a == 0 || !ctx.selected(kind, pids[i]) {
                    return;
                }
                let slot = match op {
                    Op::Free => self.slot(pids[i]),
                    Op::KernelFree => KERNEL_SLOT,
                    _ => PAGE_SLOT,
                };
                let d = self.free(slot, a);
                self.emit::<ALONE>(i, slot, d, ts[i]);
            }
            Op::Realloc => {
                let (old, new, size) = (olds[i], addrs[i], sizes[i]);
                let frees_old = realloc_frees(old, new, size);
                let own_old = frees_old && ctx.owner(old) == p;
                let own_new = new != 0 && ctx.owner(new) == p;
                if !(own_old || own_new) || !ctx.selected(kind, pids[i]) {
                    return;
                }
                let slot = self.slot(pids[i]);
                // The free comes first: realloc in place reuses the address.
                let mut d = 0;
                if own_old {
                    d += self.free(slot, old);
                }
                if own_new {
                    d += self.alloc::<ALONE>(slot, new, size, ts[i], stacks[i]);
                }
                self.emit::<ALONE>(i, slot, d, ts[i]);
            }
            op @ (Op::Map | Op::Unmap | Op::Remap) => {
                if p != 0 || !ctx.selected(kind, pids[i]) {
                    return;
                }
                let slot = self.slot(pids[i]);
                let d = self.replay_range(op, slot, *b, i);
                self.hold(slot, d, ts[i]);
                self.emit::<ALONE>(i, slot, d, ts[i]);
            }
            Op::Exec => {
                if !ctx.selected(kind, pids[i]) {
                    return;
                }
                // Everything the old program image allocated is gone: no
                // longer outstanding, nor held.
                let slot = self.slot(pids[i]);
                self.unsample_all(slot);
                let st = &mut self.pids[slot];
                let d = -st.held;
                st.blocks = BlockTable::default();
                st.ranges = RangeSet::default();
                st.gone = None;
                self.hold(slot, d, ts[i]);
                self.emit::<ALONE>(i, slot, d, ts[i]);
            }
            Op::Exit => {
                if !ctx.selected(kind, pids[i]) {
                    return;
                }
                // The process's memory goes back to the system: what it
                // held leaves the live total, but its blocks were never
                // freed and stay outstanding. (Should the pid allocate
                // again, a new process or threads outliving the main one,
                // that counts as held anew.)
                let slot = self.slot(pids[i]);
                let st = &mut self.pids[slot];
                let d = -st.held;
                st.retire();
                self.hold(slot, d, ts[i]);
                self.emit::<ALONE>(i, slot, d, ts[i]);
            }
            Op::Fork => {
                let child = addrs[i] as u32;
                if !ctx.selected(kind, pids[i]) || !ctx.selected(kind, child) || child == pids[i] {
                    return;
                }
                // The child starts with a copy of the parent's heap. The
                // parent still holds those blocks and counts them in the
                // live total: the child's copy does not count again (it
                // is the same memory until either side writes it), only
                // what the child allocates itself.
                let parent = self.slot(pids[i]);
                let copy = self.pids[parent].copy_all();
                let slot = self.slot(child);
                self.unsample_all(slot);
                let st = &mut self.pids[slot];
                let d = -st.held;
                st.blocks = BlockTable::default();
                st.ranges = RangeSet::default();
                st.born_ts = ts[i];
                if st.sampled.0 {
                    // The copies count when the child is selected without
                    // its parent, or when made at the instant of the fork.
                    for b in blocks_of(&copy.blocks, &copy.ranges) {
                        self.sampler.count(&b, st.sampled, st.born_ts, 1);
                    }
                }
                st.gone = (!copy.is_empty()).then(|| Box::new(copy));
                self.hold(slot, d, ts[i]);
                self.emit::<ALONE>(i, slot, d, ts[i]);
            }
            Op::Nothing => {}
        }
    }

    #[cold]
    fn replay_range(&mut self, op: Op, slot: usize, b: Slices<'_>, i: usize) -> i64 {
        let (addr, size, ts, stack) = (b.addr[i], b.size[i], b.ts[i], b.stack_id[i]);
        match op {
            Op::Map => {
                if addr == 0 || size == 0 {
                    return 0;
                }
                let origin = self.next_mapping;
                self.next_mapping += 1;
                let end = addr.saturating_add(size);
                let region = Region {
                    end,
                    ts,
                    stack,
                    origin,
                };
                let replaced = self.pids[slot].ranges.insert_pieces(addr, region);
                self.sample_range(slot, addr, &region, 1);
                let replaced = self.unsample_ranges(slot, &replaced);
                // What it replaced among the ranges the process no longer
                // held counted in no total.
                self.remove_gone_ranges(slot, addr, end);
                size as i64 - replaced as i64
            }
            Op::Unmap => {
                let end = addr.saturating_add(size);
                let removed = self.pids[slot].ranges.remove(addr, end);
                let removed = self.unsample_ranges(slot, &removed);
                let unheld = self.remove_gone_ranges(slot, addr, end);
                if removed + unheld > 0 {
                    self.counts.frees += 1;
                    self.counts.freed_bytes += removed + unheld;
                }
                -(removed as i64)
            }
            _ => {
                let (old, old_size) = (b.old_addr[i], b.old_size[i]);
                if addr == 0 {
                    return 0;
                }
                let origin = self.next_mapping;
                self.next_mapping += 1;
                let made_by = Region {
                    end: 0,
                    ts,
                    stack,
                    origin,
                };
                // Like realloc: the old range is released and the new one
                // is a mapping made by this mremap call.
                let removed = self.pids[slot]
                    .ranges
                    .remap_pieces(old, old_size, addr, size, made_by);
                let removed = self.unsample_ranges(slot, &removed);
                let made = Region {
                    end: addr.saturating_add(size),
                    ..made_by
                };
                self.sample_range(slot, addr, &made, 1);
                let unheld = self.remove_gone_ranges(slot, old, old.saturating_add(old_size))
                    + self.remove_gone_ranges(slot, addr, addr.saturating_add(size));
                if removed + unheld > 0 {
                    self.counts.frees += 1;
                    self.counts.freed_bytes += removed + unheld;
                }
                size as i64 - removed as i64
            }
        }
    }

    /// Removes `[lo, hi)` from the mappings the process no longer holds;
    /// returns the bytes removed.
    fn remove_gone_ranges(&mut self, slot: usize, lo: u64, hi: u64) -> u64 {
        let st = &mut self.pids[slot];
        let Some(g) = &mut st.gone else {
            return 0;
        };
        let removed = g.ranges.remove(lo, hi);
        st.drop_empty_gone();
        self.unsample_ranges(slot, &removed)
    }

    /// Adds (`sign` 1) or takes off (-1) the piece of a mapping at
    /// `start` in the growth samples.
    fn sample_range(&mut self, slot: usize, start: u64, r: &Region, sign: i64) {
        if r.end > start {
            let st = &self.pids[slot];
            let b = Block {
                size: r.end - start,
                ts: r.ts,
                stack: r.stack,
            };
            self.sampler.count(&b, st.sampled, st.born_ts, sign);
        }
    }

    /// Takes removed pieces of mappings off the growth samples; returns
    /// their bytes.
    fn unsample_ranges(&mut self, slot: usize, pieces: &[(u64, Region)]) -> u64 {
        for (start, r) in pieces {
            self.sample_range(slot, *start, r, -1);
        }
        crate::ranges::bytes(pieces)
    }

    /// Takes everything outstanding in `slot`, held or not, off the
    /// growth samples: exec and fork drop it.
    #[cold]
    fn unsample_all(&mut self, slot: usize) {
        let st = &self.pids[slot];
        if !st.sampled.0 {
            return;
        }
        let gone = st.gone.as_deref();
        let all = blocks_of(&st.blocks, &st.ranges).chain(
            gone.into_iter()
                .flat_map(|g| blocks_of(&g.blocks, &g.ranges)),
        );
        for b in all {
            self.sampler.count(&b, st.sampled, st.born_ts, -1);
        }
    }
}

/// The blocks of a table and the pieces of a set of mappings, as blocks.
fn blocks_of<'a>(blocks: &'a BlockTable, ranges: &'a RangeSet) -> impl Iterator<Item = Block> + 'a {
    blocks
        .iter()
        .map(|(_, b)| b)
        .chain(ranges.iter().map(|(start, r)| Block {
            size: r.end - start,
            ts: r.ts,
            stack: r.stack,
        }))
}
