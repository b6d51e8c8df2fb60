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

use memleak_trace::{EventKind, Trace};
use rayon::prelude::*;

use crate::decode::{Columns, Decoder, Slices};
pub use crate::table::Block;

mod allocated;
mod ctx;
mod decoded;
mod packed;
mod partition;
mod peak;
mod process;
mod types;

use allocated::Allocated;
use ctx::Ctx;
use decoded::{Decoded, Mode, PackedPool, RowsPool};
use partition::Partition;
use peak::{raise, Share};
use process::{ProcessIndex, NO_PID, NO_PROCESS};
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
                if let (Mode::Packed(packed), [p]) = (&d.mode, partitions.as_mut_slice()) {
                    let t = std::time::Instant::now();
                    p.replay_packed(packed, &ctx);
                    timed(&t_replay, t);
                    // One partition tracked the peak as it replayed.
                    (outstanding, peak, peak_ts) = (p.outstanding, p.peak, p.peak_ts);
                } else {
                    let Mode::Split {
                        cols,
                        rows_of,
                        rows_len,
                    } = &d.mode
                    else {
                        unreachable!("operations are packed for a single partition only");
                    };
                    let cols = cols.slices(n);
                    partitions.par_iter_mut().for_each(|p| {
                        let t = std::time::Instant::now();
                        let rows = &rows_of[p.index][..rows_len[p.index]];
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
            d.recycle(&decoder, &rows_pool, &packed_pool);
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
