//! Parallel, partitioned replay of a trace's events.
//!
//! An allocation and its free share an address, so the key space is split
//! by a hash of the address into partitions (by default one per two
//! worker threads, see [`default_partitions`]), and each partition
//! replays, in time order, only the events of its addresses. With several
//! partitions the rows of each row group are split into one list per
//! partition while it is decoded, so each partition reads only its rows.
//!
//! The row groups of the trace are decoded in parallel, a few ahead of the
//! one being replayed: decoding and replay share the rayon pool, and the
//! replaying thread decodes too whenever the next row group is not ready.
//! With a single partition (the default on one or two threads) the decode
//! workers turn each row group into a list of packed operations
//! that replay streams (`Packed`).
//!
//! A few things do not belong to one address:
//! * realloc frees the old address and allocates the new one, which may
//!   live in different partitions: each side is replayed by its owner;
//! * mmap ranges (munmap may span several mappings) all go to partition 0,
//!   which is cheap because they are rare;
//! * exec, exit and fork touch every block of a process: every partition
//!   applies them to its own blocks. Partitioning by address, not (pid,
//!   address), keeps a forked child's copy of a block in the parent's
//!   partition.
//!
//! The peak follows the *live total*: the outstanding bytes of processes
//! still alive, and of the kernel. A process that exits gives its memory
//! back to the system, so its blocks leave the live total then, though
//! they stay outstanding in the report (never freed: leaks); exec drops
//! the old image's blocks altogether; a forked child's copy of its
//! parent's heap counts for the parent only. The total, and each
//! process's share of it (for the peak per process), are tracked exactly
//! across partitions: each partition lists its changes by row, and a
//! sequential pass sums them in time order.
//!
//! Memory is the outstanding blocks, a small direct-mapped cache of recent
//! frees (to tell double frees from frees of blocks allocated before the
//! recording started), and a bounded window of decoded row groups; it does
//! not grow with the length of the trace.

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Mutex;

use memleak_trace::reader::RowGroupUnit;
use memleak_trace::{EventKind, Trace};
use rayon::prelude::*;

use crate::decode::{Columns, Decoder, Slices};
use crate::hash::{int_map, mix, IntMap};
use crate::ranges::{RangeSet, Region};
pub use crate::table::Block;
use crate::table::BlockTable;

mod allocated;
mod ctx;
mod packed;
mod types;

use allocated::Allocated;
use ctx::{realloc_frees, Ctx, Op, USER_TABLE};
use packed::{
    count_allocations, pack, Packed, PackedOp, CODE_SHIFT, C_ALLOC_KERNEL, C_ALLOC_PAGE,
    C_ALLOC_USER, C_FREE_KERNEL, C_FREE_PAGE, C_FREE_USER, SIZE_BITS,
};
pub use types::{
    AllocatedTotals, Anomalies, OutstandingBlock, ProcessPeak, Replay, ReplayOptions, ReplayStats,
};

/// Replays `trace` and returns the outstanding state.
pub fn replay(trace: &Trace, opts: &ReplayOptions<'_>) -> memleak_trace::Result<Replay> {
    let nparts = if opts.partitions == 0 {
        default_partitions(rayon::current_num_threads())
    } else {
        opts.partitions
    }
    .max(1);
    let max_stack = match opts.max_stack_id {
        Some(m) => m,
        None => trace
            .stacks()?
            .iter()
            .map(|s| s.stack_id)
            .max()
            .unwrap_or(0),
    };
    let ctx = Ctx::new(nparts, &opts.filter);
    let processes = ProcessIndex::default();
    let mut partitions: Vec<Partition> =
        (0..nparts).map(|i| Partition::new(i, &processes)).collect();

    let units = trace.event_units();
    // Row groups decoded ahead of the one being replayed: enough for the
    // decoding threads never to wait for replay to take one, and few
    // enough to keep memory small (a decoded row group is about 8 MB).
    let ahead = (2 * rayon::current_num_threads()).clamp(2, 64);
    let decoder = Decoder::new(trace);
    let rows_pool = RowsPool::default();
    let packed_pool = PackedPool::default();
    let allocated_pool: Mutex<Vec<Allocated>> = Mutex::new(Vec::new());
    // Where the time goes, for MEMLEAK_ANALYZE_TIMING=1 (ns of CPU in
    // decoding, replaying partitions, and the sequential peak pass).
    let timing = std::env::var_os("MEMLEAK_ANALYZE_TIMING").is_some();
    let (t_decode, t_replay, t_peak) = (AtomicI64::new(0), AtomicI64::new(0), AtomicI64::new(0));
    // Time the replaying thread spent on the next row group's decoding
    // (waiting for it, or decoding row groups itself).
    let t_wait = AtomicI64::new(0);
    let timed = |acc: &AtomicI64, t: std::time::Instant| {
        acc.fetch_add(t.elapsed().as_nanos() as i64, Relaxed);
    };
    // Decoded row groups, by unit, as the decoding tasks finish them; a
    // task's panic is kept there too, for the replaying thread to raise
    // (in the scope it would only be raised once replay stopped waiting).
    type Slot = Option<std::thread::Result<memleak_trace::Result<Decoded>>>;
    let done: Vec<Mutex<Slot>> = units.iter().map(|_| Mutex::new(None)).collect();
    // Whether a row group's decoding has been taken, by a task or by the
    // replaying thread itself when it needs one nobody has started.
    let claimed: Vec<std::sync::atomic::AtomicBool> = units
        .iter()
        .map(|_| std::sync::atomic::AtomicBool::new(false))
        .collect();
    // Set once replay stops early (an error, or the `at` cutoff), so
    // tasks not started yet skip their work.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let decode = |i: usize| {
        if stop.load(Relaxed) || claimed[i].swap(true, Relaxed) {
            return;
        }
        let t = std::time::Instant::now();
        let d = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            #[cfg(test)]
            tests::maybe_panic(trace, i);
            Decoded::read(
                &decoder,
                &units[i],
                opts.at_ts,
                &ctx,
                &rows_pool,
                &packed_pool,
                &allocated_pool,
            )
        }));
        timed(&t_decode, t);
        *crate::lock_pool(&done[i]) = Some(d);
    };

    let mut stats = ReplayStats::default();
    let mut kinds = [0u64; 256];
    let mut outstanding: i64 = 0;
    let mut peak: i64 = 0;
    let mut peak_ts = 0u64;
    let mut totals: Vec<i64> = Vec::new();
    // With several partitions: the process (its index in `processes`)
    // each row's change belongs to, and each process's share of the live
    // total.
    let mut whose: Vec<u32> = Vec::new();
    let mut shares: Vec<Share> = Vec::new();

    // Replay takes the row groups in order on this thread while the other
    // threads decode the next ones. Waiting for one, this thread decodes
    // it itself if no task has started it, else other queued row groups
    // (rayon's `yield_now`). Decoding goes on during replay and across
    // row groups, without a barrier per window of row groups that left a
    // thread idle whenever the window's decoding and replay took unequal
    // times.
    let result = rayon::in_place_scope(|scope| -> memleak_trace::Result<()> {
        let decode = &decode;
        let mut spawned = 0;
        let spawn_upto = |n: usize, spawned: &mut usize| {
            while *spawned < n.min(units.len()) {
                let i = *spawned;
                scope.spawn(move |_| decode(i));
                *spawned += 1;
            }
        };
        spawn_upto(ahead, &mut spawned);
        for (i, slot) in done.iter().enumerate() {
            let mut waited: Option<std::time::Instant> = None;
            let d = loop {
                if let Some(d) = crate::lock_pool(slot).take() {
                    break d;
                }
                waited.get_or_insert_with(std::time::Instant::now);
                if !claimed[i].load(Relaxed) {
                    decode(i);
                    continue;
                }
                match rayon::yield_now() {
                    Some(rayon::Yield::Executed) => {}
                    _ => std::thread::yield_now(),
                }
            };
            if let Some(t) = waited {
                timed(&t_wait, t);
            }
            let d = match d {
                Ok(Ok(d)) => d,
                Ok(Err(e)) => {
                    stop.store(true, Relaxed);
                    return Err(e);
                }
                Err(panic) => {
                    stop.store(true, Relaxed);
                    std::panic::resume_unwind(panic);
                }
            };
            // Row groups are in time order: once one is cut by `at`, the
            // rest are entirely after it.
            let cut = d.rows < d.total;
            if cut {
                stop.store(true, Relaxed);
            } else {
                spawn_upto(i + 1 + ahead, &mut spawned);
            }
            let n = d.rows;
            if n > 0 {
                if let (Some(packed), [p]) = (&d.packed, partitions.as_mut_slice()) {
                    let t = std::time::Instant::now();
                    p.replay_packed(packed, &ctx);
                    timed(&t_replay, t);
                    // One partition tracked the peak as it replayed.
                    (outstanding, peak, peak_ts) = (p.outstanding, p.peak, p.peak_ts);
                } else {
                    let cols = d.cols.as_ref().expect("columns or operations");
                    let cols = cols.slices(n);
                    partitions.par_iter_mut().for_each(|p| {
                        let t = std::time::Instant::now();
                        let rows = d.rows_of(p.index).expect("row lists");
                        p.replay_batch(cols, rows, &ctx);
                        timed(&t_replay, t);
                    });
                    // Sum the partitions' changes per row, then walk the
                    // rows in time order for the peaks. The changes of a
                    // row all belong to one process (or the kernel).
                    let t = std::time::Instant::now();
                    totals.clear();
                    totals.resize(n, 0);
                    whose.resize(n, NO_PROCESS);
                    // Every process a change names was numbered before
                    // the partitions replayed this row group.
                    shares.resize(processes.len() + 1, Share::default());
                    let shares = &mut shares[..];
                    for p in &mut partitions {
                        for (i, k, v) in p.deltas.drain(..) {
                            totals[i as usize] += v;
                            whose[i as usize] = k;
                        }
                    }
                    // A row without changes adds 0 to some process's
                    // share (its entry may be left from an earlier row
                    // group): no test needed. The kernel's changes go to
                    // share 0, which no process has.
                    for (i, &x) in totals.iter().enumerate() {
                        outstanding += x;
                        if outstanding > peak {
                            raise(&mut peak, &mut peak_ts, outstanding, cols.ts[i]);
                        }
                        let e = &mut shares[whose[i] as usize];
                        e.held += x;
                        if e.held > e.peak {
                            raise(&mut e.peak, &mut e.peak_ts, e.held, cols.ts[i]);
                        }
                    }
                    timed(&t_peak, t);
                }
                stats.first_ts.get_or_insert(d.first_ts);
                stats.last_ts = Some(d.last_ts);
                if let Some(f) = opts.progress {
                    f(d.total as u64);
                }
            }
            for (k, c) in kinds.iter_mut().zip(d.kinds.iter()) {
                *k += c;
            }
            if let Some(c) = d.cols {
                decoder.recycle(c);
            }
            if let Some(r) = d.rows_of {
                crate::lock_pool(&rows_pool).push(r);
            }
            if let Some(p) = d.packed {
                crate::lock_pool(&packed_pool).push(p);
            }
            if cut {
                break;
            }
        }
        Ok(())
    });
    result?;

    if timing {
        let s = |a: &AtomicI64| a.load(Relaxed) as f64 / 1e9;
        eprintln!(
            "memleak: timing: decode {:.3}s, replay {:.3}s ({nparts} partitions), peak pass {:.3}s (CPU seconds); replay waited for decoding {:.3}s",
            s(&t_decode),
            s(&t_replay),
            s(&t_peak),
            s(&t_wait)
        );
    }
    for &kind in EventKind::ALL {
        if kinds[kind as usize] > 0 {
            stats.events_by_kind.insert(kind, kinds[kind as usize]);
        }
    }
    for p in &partitions {
        stats.frees += p.counts.frees;
        stats.freed_bytes += p.counts.freed_bytes;
        stats.anomalies.add(&p.counts.anomalies);
    }
    let mut allocated = Allocated::new(max_stack);
    for a in allocated_pool
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
    {
        allocated.merge(&a);
    }
    stats.allocations = allocated.allocations;
    stats.allocated_bytes = allocated.bytes;
    stats.peak_bytes = peak.max(0) as u64;
    stats.peak_ts = peak_ts;
    stats.live_bytes = outstanding.max(0) as u64;
    let peaks: Vec<(u32, i64, u64)> = match partitions.as_slice() {
        // One partition followed each process's peak as it replayed.
        [p] => p.pids[2..]
            .iter()
            .map(|st| (st.pid, st.peak, st.peak_ts))
            .collect(),
        _ => {
            let pids = processes.pids();
            shares
                .iter()
                .enumerate()
                .skip(1)
                .map(|(k, e)| (pids[k - 1], e.peak, e.peak_ts))
                .collect()
        }
    };
    stats.process_peaks = peaks
        .into_iter()
        .filter(|&(pid, peak, _)| pid < NO_PID && peak > 0)
        .map(|(pid, peak, ts)| ProcessPeak {
            pid,
            bytes: peak as u64,
            ts,
        })
        .collect();
    stats.process_peaks.sort_unstable_by_key(|p| p.pid);
    Ok(Replay {
        partitions,
        allocated,
        stats,
    })
}

/// One decoded row group and what was counted while decoding it.
struct Decoded {
    /// With several partitions: the columns, and the rows each partition
    /// takes part in (the first `rows_len[p]` entries of `rows_of[p]`;
    /// the vectors are recycled and longer).
    cols: Option<Columns>,
    rows_of: Option<Vec<Vec<u32>>>,
    rows_len: Vec<usize>,
    /// With a single partition: the row group as [`Packed`] operations,
    /// the filter applied.
    packed: Option<Packed>,
    /// Rows at or before the `at` cutoff, and all the rows.
    rows: usize,
    total: usize,
    /// Times of the first and last of `rows`.
    first_ts: u64,
    last_ts: u64,
    kinds: Box<[u64; 256]>,
}

/// Row lists of spent [`Decoded`]s, for reuse.
type RowsPool = std::sync::Mutex<Vec<Vec<Vec<u32>>>>;

/// Operation lists of spent [`Decoded`]s, for reuse.
type PackedPool = std::sync::Mutex<Vec<Packed>>;

impl Decoded {
    fn read(
        decoder: &Decoder<'_>,
        unit: &RowGroupUnit,
        at: Option<u64>,
        ctx: &Ctx<'_>,
        pool: &RowsPool,
        packed_pool: &PackedPool,
        allocated: &Mutex<Vec<Allocated>>,
    ) -> memleak_trace::Result<Decoded> {
        let mut kinds = Box::new([0u64; 256]);
        let mut acc = crate::lock_pool(allocated)
            .pop()
            .unwrap_or_else(|| Allocated::new(0));
        let total = unit.rows as usize;
        let mut d = if ctx.nparts == 1 {
            let mut packed = crate::lock_pool(packed_pool).pop().unwrap_or_default();
            packed.ops.clear();
            packed.rows.clear();
            let (mut rows, mut first_ts, mut last_ts) = (0usize, None, 0u64);
            let r = decoder.stream(unit, &mut |b: Slices<'_>| {
                let all = b.ts.len();
                let n = match at {
                    Some(at) => b.ts.partition_point(|&t| t <= at),
                    None => all,
                };
                if n > 0 {
                    first_ts.get_or_insert(b.ts[0]);
                    last_ts = b.ts[n - 1];
                    pack(b.range(0, n), ctx, &mut kinds, &mut acc, &mut packed);
                }
                rows += n;
                n == all
            });
            if let Err(e) = r {
                crate::lock_pool(allocated).push(acc);
                return Err(e);
            }
            Decoded {
                cols: None,
                rows_of: None,
                rows_len: Vec::new(),
                packed: Some(packed),
                rows,
                total,
                first_ts: first_ts.unwrap_or(0),
                last_ts,
                kinds,
            }
        } else {
            let cols = match decoder.read(unit) {
                Ok(c) => c,
                Err(e) => {
                    crate::lock_pool(allocated).push(acc);
                    return Err(e);
                }
            };
            let all = cols.slices(cols.len());
            let rows = match at {
                Some(at) => all.ts.partition_point(|&t| t <= at),
                None => cols.len(),
            };
            let b = cols.slices(rows);
            count_allocations(b, ctx, &mut kinds, &mut acc);
            let mut rows_len = vec![0; ctx.nparts];
            let mut out = crate::lock_pool(pool).pop().unwrap_or_default();
            split_rows(b, ctx, &mut out, &mut rows_len);
            let (first_ts, last_ts) = match rows {
                0 => (0, 0),
                _ => (b.ts[0], b.ts[rows - 1]),
            };
            Decoded {
                total: cols.len(),
                cols: Some(cols),
                rows_of: Some(out),
                rows_len,
                packed: None,
                rows,
                first_ts,
                last_ts,
                kinds,
            }
        };
        crate::lock_pool(allocated).push(acc);
        d.total = d.total.max(d.rows);
        Ok(d)
    }

    /// The rows partition `p` takes part in; `None` with one partition.
    fn rows_of(&self, p: usize) -> Option<&[u32]> {
        self.rows_of.as_ref().map(|r| &r[p][..self.rows_len[p]])
    }
}

/// Lists, for each partition, the rows it takes part in: the owner of the
/// address (both owners for a realloc), partition 0 for mappings, every
/// partition for exec, exit and fork. Done while decoding, in parallel, so
/// each replay worker reads only its own rows. `out[p]` gets its rows in its
/// first `len[p]` entries: the vectors are sized to the row group once
/// and written by index, without a capacity check per row.
fn split_rows(b: Slices<'_>, ctx: &Ctx<'_>, out: &mut Vec<Vec<u32>>, len: &mut [usize]) {
    let n = b.kind.len();
    out.resize_with(ctx.nparts, Vec::new);
    for o in out.iter_mut() {
        if o.len() < n {
            o.resize(n, 0);
        }
    }
    len.fill(0);
    for i in 0..n {
        let kind = b.kind[i] as usize;
        if ctx.by_addr[kind] {
            // Allocations and frees: the owner of the address.
            let p = ctx.owner(b.addr[i]);
            out[p][len[p]] = i as u32;
            len[p] += 1;
            continue;
        }
        let mut put = |p: usize| {
            out[p][len[p]] = i as u32;
            len[p] += 1;
        };
        match ctx.ops[kind] {
            Op::Realloc => {
                let (new, old) = (b.addr[i], b.old_addr[i]);
                let p = if new != 0 {
                    ctx.owner(new)
                } else {
                    ctx.owner(old)
                };
                put(p);
                if old != 0 && new != 0 && ctx.owner(old) != p {
                    put(ctx.owner(old));
                }
            }
            Op::Map | Op::Unmap | Op::Remap => put(0),
            Op::Exec | Op::Exit | Op::Fork => (0..ctx.nparts).for_each(put),
            _ => {}
        }
    }
}

/// Kernel slab and per-CPU allocations share one address space, keyed by
/// address alone. Pages are keyed by page frame number, which is not an
/// address, so they get a namespace of their own.
const KERNEL_PID: u32 = u32::MAX;
const PAGE_PID: u32 = u32::MAX - 1;
const KERNEL_SLOT: usize = 0;
const PAGE_SLOT: usize = 1;
/// No slot: a process the pid cache did not hold (see
/// [`Partition::known_slot`]).
const UNKNOWN_SLOT: usize = usize::MAX;
/// Never a real pid (Linux pids stay below 2^22).
const NO_PID: u32 = u32::MAX - 2;

#[derive(Default, Clone, Copy)]
struct Counts {
    frees: u64,
    freed_bytes: u64,
    anomalies: Anomalies,
}

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
struct PidState {
    pid: u32,
    /// Its number in the [`ProcessIndex`] ([`NO_PROCESS`] for the
    /// kernel's).
    process: u32,
    blocks: BlockTable,
    /// Only partition 0 has mappings.
    ranges: RangeSet,
    /// Outstanding, but no longer counted in the live total.
    gone: Option<Box<Gone>>,
    /// Bytes of `blocks` and `ranges`: what the process counts for in
    /// the live total.
    held: i64,
    /// The peak of `held` and when it was first reached: the process's
    /// peak with a single partition (several partitions each hold a part,
    /// and the sequential pass sums them).
    peak: i64,
    peak_ts: u64,
}

/// Outstanding blocks and mappings of a process that no longer count in
/// the live total (see [`PidState`]).
#[derive(Clone, Default)]
struct Gone {
    blocks: BlockTable,
    ranges: RangeSet,
}

impl Gone {
    fn is_empty(&self) -> bool {
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
    fn new(pid: u32, process: u32) -> Self {
        PidState {
            pid,
            process,
            blocks: BlockTable::default(),
            ranges: RangeSet::default(),
            gone: None,
            held: 0,
            peak: 0,
            peak_ts: 0,
        }
    }

    /// The process no longer holds its blocks and mappings (it exited):
    /// they stay outstanding, in `gone`. `held` is left to the caller,
    /// which emits the change.
    fn retire(&mut self) {
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
    fn drop_empty_gone(&mut self) {
        if self.gone.as_ref().is_some_and(|g| g.is_empty()) {
            self.gone = None;
        }
    }

    /// A copy of everything outstanding in the process, held or not: what
    /// a child inherits at fork.
    fn copy_all(&self) -> Gone {
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

/// A process's share of the live total and its peak, as the sequential
/// pass over several partitions' changes follows them.
#[derive(Clone, Copy, Default)]
struct Share {
    held: i64,
    peak: i64,
    peak_ts: u64,
}

/// In [`Partition::deltas`]: a change that belongs to no process (the
/// kernel's, or a pid replay keeps for itself).
const NO_PROCESS: u32 = 0;

/// Numbers the processes of a replay from 1, the same in every partition,
/// so the sequential pass finds a process's share by index. A partition
/// asks once per process, when it first meets it.
#[derive(Clone, Default)]
struct ProcessIndex(std::sync::Arc<Mutex<Numbers>>);

/// The numbers of [`ProcessIndex`]: by pid, and the pids in order.
#[derive(Default)]
struct Numbers {
    of: IntMap<u32, u32>,
    pids: Vec<u32>,
}

impl ProcessIndex {
    /// The number of `pid`; [`NO_PROCESS`] for the pids replay keeps for
    /// the kernel (and a process whose pid collides with them).
    fn of(&self, pid: u32) -> u32 {
        if pid >= NO_PID {
            return NO_PROCESS;
        }
        let mut g = crate::lock_pool(&self.0);
        let Numbers { of, pids } = &mut *g;
        *of.entry(pid).or_insert_with(|| {
            pids.push(pid);
            pids.len() as u32
        })
    }

    /// How many processes have a number.
    fn len(&self) -> usize {
        crate::lock_pool(&self.0).pids.len()
    }

    /// The pids, by number less 1.
    fn pids(&self) -> Vec<u32> {
        crate::lock_pool(&self.0).pids.clone()
    }
}

/// A new peak: out of line, so the test before it stays a branch (taken
/// rarely once the peak is reached) rather than conditional moves of
/// values the loop keeps in memory.
#[cold]
#[inline(never)]
fn raise(peak: &mut i64, peak_ts: &mut u64, value: i64, ts: u64) {
    *peak = value;
    *peak_ts = ts;
}

/// An allocation at `addr` in a process with blocks it no longer holds:
/// one of them at that address was never freed (a missed free). It did
/// not count in the live total: nothing to take off.
#[cold]
#[inline(never)]
fn replace_gone(st: &mut PidState, counts: &mut Counts, addr: u64) {
    if let Some(g) = &mut st.gone {
        if g.blocks.remove(addr).is_some() {
            counts.anomalies.missed_frees += 1;
        }
    }
    st.drop_empty_gone();
}

/// Frees the block at `addr` among those the process no longer holds, if
/// it is there: it leaves the report, but the live total did not count
/// it.
#[cold]
#[inline(never)]
fn free_gone(st: &mut PidState, counts: &mut Counts, addr: u64) -> bool {
    let Some(g) = &mut st.gone else {
        return false;
    };
    let Some(b) = g.blocks.remove(addr) else {
        return false;
    };
    counts.frees += 1;
    counts.freed_bytes += b.size;
    st.drop_empty_gone();
    true
}

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

struct Partition {
    index: usize,
    processes: ProcessIndex,
    pids: Vec<PidState>,
    slot_of: IntMap<u32, usize>,
    /// Direct-mapped cache of `slot_of`: events of several processes
    /// interleave, so a last-used entry would miss.
    pid_cache: [(u32, u32); PID_CACHE],
    /// Fingerprints of recently freed (namespace, address) pairs.
    recent_frees: Box<[u64]>,
    counts: Counts,
    /// Changes of the live total this partition made in the current row
    /// group: (row, number of the process whose holdings changed, delta),
    /// in row order.
    /// Each partition keeps its own so no two threads write the same
    /// cache line.
    deltas: Vec<(u32, u32, i64)>,
    /// With a single partition, which lists no changes: the live total
    /// (bytes outstanding in processes alive, and in the kernel), its
    /// peak and when it was reached.
    outstanding: i64,
    peak: i64,
    peak_ts: u64,
    next_mapping: u64,
}

impl Partition {
    fn new(index: usize, processes: &ProcessIndex) -> Self {
        Partition {
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
        }
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
                self.pids.push(PidState::new(pid, process));
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
        let (size, ts) = (b.size, b.ts);
        let st = &mut self.pids[slot];
        let d = match st.blocks.insert_hashed(addr, h, b) {
            None => {
                if st.gone.is_some() {
                    replace_gone(st, &mut self.counts, addr);
                }
                size as i64
            }
            Some(old) => {
                self.counts.anomalies.missed_frees += 1;
                size as i64 - old.size as i64
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
                self.counts.frees += 1;
                self.counts.freed_bytes += b.size;
                -(b.size as i64)
            }
            None if st.gone.is_some() && free_gone(st, &mut self.counts, addr) => 0,
            None => {
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
    fn replay_packed(&mut self, packed: &Packed, ctx: &Ctx<'_>) {
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
    fn replay_batch(&mut self, b: Slices<'_>, rows: &[u32], ctx: &Ctx<'_>) {
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
                let st = &mut self.pids[slot];
                let d = -st.held;
                st.blocks = BlockTable::default();
                st.ranges = RangeSet::default();
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
                let replaced = self.pids[slot].ranges.insert(
                    addr,
                    Region {
                        end,
                        ts,
                        stack,
                        origin,
                    },
                );
                // What it replaced among the ranges the process no longer
                // held counted in no total.
                self.remove_gone_ranges(slot, addr, end);
                size as i64 - replaced as i64
            }
            Op::Unmap => {
                let end = addr.saturating_add(size);
                let removed: u64 = self.pids[slot]
                    .ranges
                    .remove(addr, end)
                    .iter()
                    .map(|(s, r)| r.end - s)
                    .sum();
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
                    .remap(old, old_size, addr, size, made_by);
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
        let removed = g.ranges.remove(lo, hi).iter().map(|(s, r)| r.end - s).sum();
        st.drop_empty_gone();
        removed
    }
}

/// Partitions for `threads` worker threads: half of them. Decoding a row
/// group costs about as much CPU as replaying it, and decoding runs on
/// whichever threads are free while the partitions replay earlier row
/// groups, so half the threads replaying and the rest decoding keeps both
/// busy. Every extra partition also costs: rows are split among the
/// partitions while decoding, and each partition reads the columns of
/// every row it is given. With two threads one partition (replay on one
/// thread, decoding mostly on the other) took 3.0 s on the 100 M-event
/// bench trace where two partitions took 3.5 s (docs/benchmarks.md).
pub fn default_partitions(threads: usize) -> usize {
    (threads / 2).max(1)
}

/// Sets the number of worker threads of the global rayon pool, which
/// replay uses. Call it before anything else uses rayon.
pub fn set_threads(threads: usize) -> Result<(), String> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build_global()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use memleak_trace::{Event, Meta, TraceWriter, WriterOptions};
    use std::path::PathBuf;

    /// The trace whose third row group's decoding panics.
    static PANICKING: Mutex<Option<PathBuf>> = Mutex::new(None);

    pub(super) fn maybe_panic(trace: &Trace, unit: usize) {
        let p = PANICKING.lock().unwrap().clone();
        if unit == 2 && p.as_deref() == Some(trace.path()) {
            panic!("decoding failed on purpose");
        }
    }

    /// A panic while decoding a row group reaches the caller, at one and
    /// two partitions, instead of leaving replay waiting for the row group
    /// for ever.
    #[test]
    fn a_panic_while_decoding_reaches_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let opts = WriterOptions {
            row_group_rows: 10,
            ..WriterOptions::default()
        };
        let mut w = TraceWriter::create(&path, Meta::default(), opts).unwrap();
        for i in 0..100u64 {
            w.push_event(&Event {
                ts_ns: 1000 + i,
                pid: 7,
                tid: 7,
                kind: EventKind::Malloc,
                addr: 0x1000 + i * 16,
                size: 16,
                old_addr: None,
                old_size: None,
                stack_id: Some(1),
            })
            .unwrap();
        }
        w.finish().unwrap();
        let trace = Trace::open(&path).unwrap();
        *PANICKING.lock().unwrap() = Some(trace.path().to_path_buf());
        for partitions in [1, 2] {
            let (tx, rx) = std::sync::mpsc::channel();
            let path = path.clone();
            std::thread::spawn(move || {
                let trace = Trace::open(&path).unwrap();
                let opts = ReplayOptions {
                    partitions,
                    ..ReplayOptions::default()
                };
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    rayon::scope(|_| replay(&trace, &opts).map(|r| r.stats().events()))
                }));
                tx.send(r.is_err()).unwrap();
            });
            let panicked = rx
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("replay returned within 30 s");
            assert!(
                panicked,
                "{partitions} partitions: the panic reached the caller"
            );
        }
    }
}
