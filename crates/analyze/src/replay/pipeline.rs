//! The decoding pipeline: the row groups of a trace are decoded in
//! parallel, a few ahead of the one being replayed, and handed to replay
//! in order ([`decode_in_order`]); and [`Timing`], where the time of both
//! goes.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use memleak_trace::Trace;

use super::allocated::Allocated;
use super::ctx::Ctx;
use super::decoded::{Decoded, PackedPool, RowsPool};
use memleak_trace::events::Decoder;

/// Where the time goes, for MEMLEAK_ANALYZE_TIMING=1: ns of CPU in
/// decoding, replaying partitions, and the sequential peak pass.
#[derive(Default)]
pub(super) struct Timing {
    pub(super) decode: AtomicI64,
    pub(super) replay: AtomicI64,
    pub(super) peak: AtomicI64,
    /// Time the replaying thread spent on the next row group's decoding
    /// (waiting for it, or decoding row groups itself).
    pub(super) wait: AtomicI64,
}

/// Adds the time since `t` to `acc`.
pub(super) fn timed(acc: &AtomicI64, t: Instant) {
    acc.fetch_add(t.elapsed().as_nanos() as i64, Relaxed);
}

impl Timing {
    /// Prints the times, if MEMLEAK_ANALYZE_TIMING is set.
    pub(super) fn report(&self, nparts: usize) {
        if std::env::var_os("MEMLEAK_ANALYZE_TIMING").is_none() {
            return;
        }
        let s = |a: &AtomicI64| a.load(Relaxed) as f64 / 1e9;
        eprintln!(
            "memleak: timing: decode {:.3}s, replay {:.3}s ({nparts} partitions), peak pass {:.3}s (CPU seconds); replay waited for decoding {:.3}s",
            s(&self.decode),
            s(&self.replay),
            s(&self.peak),
            s(&self.wait)
        );
    }
}

/// Decodes the row groups of `trace` (up to the `at` cutoff) and calls
/// `replay` with each, in order; returns the allocations the decode
/// workers counted, in pieces to merge.
///
/// Replay takes the row groups in order on this thread while the other
/// threads decode the next ones. Waiting for one, this thread decodes it
/// itself if no task has started it, else other queued row groups
/// (rayon's `yield_now`). Decoding goes on during replay and across row
/// groups, without a barrier per window of row groups that left a thread
/// idle whenever the window's decoding and replay took unequal times.
pub(super) fn decode_in_order(
    trace: &Trace,
    (at, at_row): (Option<u64>, Option<u64>),
    ctx: &Ctx<'_>,
    timing: &Timing,
    mut replay: impl FnMut(&Decoded),
) -> memleak_trace::Result<Vec<Allocated>> {
    let units = trace.event_units();
    // The rows of each row group before the `at_row` cutoff.
    let mut first_row = 0u64;
    let limits: Vec<usize> = units
        .iter()
        .map(|u| {
            let limit = match at_row {
                Some(r) => (r + 1).saturating_sub(first_row).min(u.rows) as usize,
                None => usize::MAX,
            };
            first_row += u.rows;
            limit
        })
        .collect();
    // Row groups decoded ahead of the one being replayed: enough for the
    // decoding threads never to wait for replay to take one, and few
    // enough to keep memory small (a decoded row group is about 8 MB).
    let ahead = (2 * rayon::current_num_threads()).clamp(2, 64);
    let decoder = Decoder::new(trace);
    let rows_pool = RowsPool::default();
    let packed_pool = PackedPool::default();
    let allocated_pool: Mutex<Vec<Allocated>> = Mutex::new(Vec::new());
    // Decoded row groups, by unit, as the decoding tasks finish them; a
    // task's panic is kept there too, for the replaying thread to raise
    // (in the scope it would only be raised once replay stopped waiting).
    type Slot = Option<std::thread::Result<memleak_trace::Result<Decoded>>>;
    let done: Vec<Mutex<Slot>> = units.iter().map(|_| Mutex::new(None)).collect();
    // Whether a row group's decoding has been taken, by a task or by the
    // replaying thread itself when it needs one nobody has started.
    let claimed: Vec<AtomicBool> = units.iter().map(|_| AtomicBool::new(false)).collect();
    // Set once replay stops early (an error, or the `at` cutoff), so
    // tasks not started yet skip their work.
    let stop = AtomicBool::new(false);
    let decode = |i: usize| {
        if stop.load(Relaxed) || claimed[i].swap(true, Relaxed) {
            return;
        }
        let t = Instant::now();
        let d = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            #[cfg(test)]
            super::tests::maybe_panic(trace, i);
            Decoded::read(
                &decoder,
                &units[i],
                (at, limits[i]),
                ctx,
                &rows_pool,
                &packed_pool,
                &allocated_pool,
            )
        }));
        timed(&timing.decode, t);
        *crate::pool::lock_pool(&done[i]) = Some(d);
    };

    rayon::in_place_scope(|scope| -> memleak_trace::Result<()> {
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
            let mut waited: Option<Instant> = None;
            let d = loop {
                if let Some(d) = crate::pool::lock_pool(slot).take() {
                    break d;
                }
                waited.get_or_insert_with(Instant::now);
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
                timed(&timing.wait, t);
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
            replay(&d);
            d.recycle(&decoder, &rows_pool, &packed_pool);
            if cut {
                break;
            }
        }
        Ok(())
    })?;
    // What was decoded is trusted only once the files match their
    // checksums (checked as they were read, for a trace opened with
    // `Trace::open_deferred`; the rest of each file now).
    trace.verify_events()?;
    Ok(allocated_pool
        .into_inner()
        .unwrap_or_else(|e| e.into_inner()))
}
