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
//!
//! The parts, in the order a row group goes through them:
//! * `pipeline.rs`: decodes row groups in parallel and hands them to
//!   [`replay`] in order;
//! * `decoded.rs`: what a decode worker makes of a row group, in one of two
//!   forms: `packed.rs`'s operations for a single partition, or columns
//!   and one row list per partition for several; `ctx.rs` holds the tables
//!   by event kind both use, `allocated.rs` the allocations counted on
//!   the way;
//! * `partition.rs`: the two replay engines and a partition's state, with
//!   the per-process state in `process.rs`;
//! * `peak.rs`: the live total and its peaks across partitions;
//! * `live.rs`: a replay fed rows as they are recorded, for the
//!   recorder's leak scan;
//! * `types.rs`: the public options and results, re-exported here.

use std::time::Instant;

use memleak_trace::{EventKind, Trace};
use rayon::prelude::*;

pub use crate::table::Block;

mod allocated;
mod counts;
mod ctx;
mod decoded;
mod live;
mod packed;
mod partition;
mod peak;
mod pipeline;
mod process;
mod samples;
mod temporary;
mod types;

use allocated::Allocated;
pub use allocated::AllocatedTotals;
pub use counts::Anomalies;
use ctx::Ctx;
use decoded::{Decoded, Mode};
pub use live::LiveReplay;
use partition::Partition;
use peak::LiveTotal;
use pipeline::{decode_in_order, timed, Timing};
use process::ProcessIndex;
pub use samples::GrowthPlan;
use samples::Sampler;
pub(crate) use types::GrowthSamples;
pub use types::{
    OutstandingBlock, ProcessPeak, Replay, ReplayOptions, ReplayStats, DEFAULT_TEMPORARY_NS,
};

/// Replays `trace` and returns the outstanding state.
pub fn replay(trace: &Trace, opts: &ReplayOptions<'_>) -> memleak_trace::Result<Replay> {
    let nparts = partition_count(opts);
    let max_stack = max_stack_id(trace, opts)?;
    let temporary_ns = match opts.temporary_ns {
        0 => DEFAULT_TEMPORARY_NS,
        t => t,
    };
    let mut ctx = Ctx::new(nparts, &opts.filter, temporary_ns);
    ctx.sampling = opts.sampling;
    let mut carry = temporary::Carry::default();
    let processes = ProcessIndex::default();
    let plan = opts.growth.clone().map(std::sync::Arc::new);
    let mut partitions: Vec<Partition> = (0..nparts)
        .map(|i| {
            let mut p = Partition::new(i, &processes, Sampler::new(plan.clone()));
            p.sampling = opts.sampling;
            p
        })
        .collect();
    let timing = Timing::default();
    let mut live = LiveTotal::default();
    let mut stats = ReplayStats::default();
    let mut kinds = [0u64; 256];
    let mut base = 0u64;
    let at = (opts.at_ts, opts.at_row);
    let counted = decode_in_order(trace, at, &ctx, &timing, |d| {
        if d.rows > 0 {
            replay_row_group(
                d,
                &mut partitions,
                &ctx,
                &processes,
                &mut live,
                &timing,
                base,
            );
            stats.first_ts.get_or_insert(d.first_ts);
            stats.last_ts = Some(d.last_ts);
            carry.next(&d.temps, temporary_ns, d.last_ts);
            if let Some(f) = opts.progress {
                f(d.total as u64);
            }
        }
        for (k, c) in kinds.iter_mut().zip(d.kinds.iter()) {
            *k += c;
        }
        base += d.total as u64;
    })?;
    timing.report(nparts);
    let mut allocated = Allocated::new(max_stack);
    for a in &counted {
        allocated.merge(a);
    }
    for (&stack, &n) in &carry.temporary {
        allocated.add_temporary(stack, n);
    }
    add_totals(&mut stats, &kinds, &partitions, &allocated, &live);
    stats.process_peaks = live.process_peaks(&partitions, &processes);
    let growth = plan.map(|_| merge_samples(&mut partitions));
    Ok(Replay {
        partitions,
        allocated,
        stats,
        growth,
    })
}

/// Ends every partition's sampling and sums the partitions' samples.
fn merge_samples(partitions: &mut [Partition]) -> GrowthSamples {
    let mut out = GrowthSamples::default();
    for p in partitions {
        let (rows, totals) = std::mem::replace(&mut p.sampler, Sampler::new(None)).finish();
        if out.totals.is_empty() {
            (out.rows, out.totals) = (rows, totals);
            continue;
        }
        for (a, b) in out.totals.iter_mut().zip(&totals) {
            *a += b;
        }
        for (stack, row) in rows {
            match out.rows.get_mut(&stack) {
                Some(r) => r.iter_mut().zip(row.iter()).for_each(|(a, b)| *a += b),
                None => {
                    out.rows.insert(stack, row);
                }
            }
        }
    }
    out
}

/// The number of partitions to replay with.
fn partition_count(opts: &ReplayOptions<'_>) -> usize {
    if opts.partitions == 0 {
        default_partitions(rayon::current_num_threads())
    } else {
        opts.partitions
    }
    .max(1)
}

/// The highest stack id of the trace, which sizes the per-stack totals.
fn max_stack_id(trace: &Trace, opts: &ReplayOptions<'_>) -> memleak_trace::Result<u64> {
    Ok(match opts.max_stack_id {
        Some(m) => m,
        None => trace
            .stacks()?
            .iter()
            .map(|s| s.stack_id)
            .max()
            .unwrap_or(0),
    })
}

/// Replays a decoded row group with at least one row, by whichever
/// engine its form is for, and follows the live total.
fn replay_row_group(
    d: &Decoded,
    partitions: &mut [Partition],
    ctx: &Ctx<'_>,
    processes: &ProcessIndex,
    live: &mut LiveTotal,
    timing: &Timing,
    base: u64,
) {
    match (&d.mode, partitions) {
        (Mode::Packed(packed), [p]) => {
            let t = Instant::now();
            p.replay_packed(packed, ctx);
            timed(&timing.replay, t);
            // One partition tracked the peak as it replayed.
            live.follow(p);
        }
        (
            Mode::Split {
                cols,
                rows_of,
                rows_len,
            },
            partitions,
        ) => {
            let cols = cols.slices(d.rows);
            partitions.par_iter_mut().for_each(|p| {
                let t = Instant::now();
                let rows = &rows_of[p.index][..rows_len[p.index]];
                p.replay_batch(cols, rows, ctx);
                timed(&timing.replay, t);
            });
            let t = Instant::now();
            live.sum(partitions, cols.ts, processes.len(), base);
            timed(&timing.peak, t);
        }
        (Mode::Packed(_), _) => unreachable!("operations are packed for a single partition only"),
    }
}

/// Adds to `stats` the totals of a finished replay: the events read by
/// kind, what the partitions freed, what the decode workers counted
/// allocated, and the live total.
fn add_totals(
    stats: &mut ReplayStats,
    kinds: &[u64; 256],
    partitions: &[Partition],
    allocated: &Allocated,
    live: &LiveTotal,
) {
    for &kind in EventKind::ALL {
        if kinds[kind as usize] > 0 {
            stats.events_by_kind.insert(kind, kinds[kind as usize]);
        }
    }
    for p in partitions {
        stats.frees += p.counts.frees;
        stats.freed_bytes += p.counts.freed_bytes;
        stats.anomalies.add(&p.counts.anomalies);
    }
    stats.allocations = allocated.allocations;
    stats.allocated_bytes = allocated.bytes;
    stats.temporary = allocated.temporary;
    stats.peak_bytes = live.peak.max(0) as u64;
    stats.peak_ts = live.peak_ts;
    stats.peak_row = live.peak_row;
    stats.live_bytes = live.outstanding.max(0) as u64;
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
    use std::sync::Mutex;

    /// The trace whose third row group's decoding panics.
    static PANICKING: Mutex<Option<PathBuf>> = Mutex::new(None);

    pub(super) fn maybe_panic(trace: &Trace, unit: usize) {
        let p = PANICKING.lock().unwrap().clone();
        if unit == 2 && p.as_deref() == Some(trace.path()) {
            panic!("decoding failed on purpose");
        }
    }

    /// A realloc that moves a block between addresses of different
    /// partitions: the free of the old address is replayed by the
    /// partition that owns the old address, which holds the block, and
    /// the allocation by the owner of the new one (`split_rows`, and the
    /// packed operations' free then alloc). Each move here crosses from
    /// one partition of two to the other, and some stay put, and the
    /// chain's old addresses are freed again afterwards: had a move's free
    /// gone anywhere but to the block's partition, the block would stay
    /// outstanding there, or its second free would not be a double free.
    /// One, two and three partitions give the same answer.
    #[test]
    fn realloc_frees_the_old_block_in_the_partition_that_holds_it() {
        let filter = crate::filter::Filter::default().resolve(0);
        let two = Ctx::new(2, &filter, DEFAULT_TEMPORARY_NS);
        // 40 addresses, consecutive ones owned by different partitions
        // of two (but every fifth owned by the same as the one before).
        let mut addrs = vec![0x10_0000u64];
        let mut a = addrs[0];
        while addrs.len() < 40 {
            a += 0x40;
            let prev = *addrs.last().unwrap();
            let same = addrs.len() % 5 == 0;
            if (two.owner(a) == two.owner(prev)) == same {
                addrs.push(a);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let opts = WriterOptions {
            row_group_rows: 16,
            ..WriterOptions::default()
        };
        let mut w = TraceWriter::create(&path, Meta::default(), opts).unwrap();
        let mut ts = 1000;
        let mut ev = |kind, addr, size, old_addr: Option<u64>, stack| {
            ts += 10;
            w.push_event(&Event {
                ts_ns: ts,
                pid: 7,
                tid: 7,
                kind,
                addr,
                size,
                old_addr,
                old_size: None,
                stack_id: Some(stack),
            })
            .unwrap();
        };
        // Block one walks the first 20 addresses, block two the last 20
        // backwards, interleaved; block two is never freed.
        ev(EventKind::Malloc, addrs[0], 1, None, 1);
        ev(EventKind::Malloc, addrs[39], 1000, None, 2);
        for i in 1..20 {
            let size = 1 + i as u64;
            ev(EventKind::Realloc, addrs[i], size, Some(addrs[i - 1]), 1);
            ev(
                EventKind::Realloc,
                addrs[39 - i],
                1000 + size,
                Some(addrs[40 - i]),
                2,
            );
        }
        ev(EventKind::Free, addrs[19], 0, None, 0);
        // Every old address of block one, freed again.
        for &old in &addrs[..19] {
            ev(EventKind::Free, old, 0, None, 0);
        }
        w.finish().unwrap();
        let trace = Trace::open(&path).unwrap();
        for partitions in [1, 2, 3] {
            let r = replay(
                &trace,
                &ReplayOptions {
                    partitions,
                    ..ReplayOptions::default()
                },
            )
            .unwrap();
            let held: Vec<Vec<(u64, u64, u64)>> = r.fold_outstanding(Vec::new, |v, b| {
                v.push((b.addr, b.size, b.stack));
            });
            let held: Vec<_> = held.into_iter().flatten().collect();
            assert_eq!(held, vec![(addrs[20], 1020, 2)], "{partitions} partitions");
            let s = r.stats();
            // 19 moves of each block and the free of block one.
            assert_eq!(s.frees, 19 + 19 + 1, "{partitions} partitions");
            assert_eq!(s.anomalies.missed_frees, 0, "{partitions} partitions");
            // The second frees are of addresses freed by the moves; the
            // recent-frees cache tells most of them as double frees, and
            // none may free a block.
            assert_eq!(
                s.anomalies.double_frees + s.anomalies.unknown_frees,
                19,
                "{partitions} partitions"
            );
            assert_eq!(s.live_bytes, 1020, "{partitions} partitions");
            // The peak: both blocks at their largest, block one just
            // before it is freed.
            assert_eq!(s.peak_bytes, 20 + 1020, "{partitions} partitions");
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
