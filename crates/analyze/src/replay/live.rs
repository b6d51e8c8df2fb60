//! Replay fed with rows as they are recorded ([`LiveReplay`]), for the
//! recorder's leak scan: the outstanding blocks of a process at its exit
//! are known when it exits, without reading the trace back.
//!
//! It is [`replay`](super::replay) of a single partition, with the same
//! packing and the same engine, fed batch by batch in the order the rows
//! are written instead of row group by row group from the files: so its
//! outstanding blocks are the ones `replay` of the trace so far finds.
//! What only reports need (temporaries, growth samples, the peak, the
//! allocations by stack) is left out.

use memleak_trace::events::{Decoder, Slices};
use memleak_trace::Trace;

use super::ctx::Ctx;
use super::packed::{pack_only, Packed};
use super::partition::Partition;
use super::process::ProcessIndex;
use super::samples::Sampler;
use super::types::fold_partitions;
use super::types::{OutstandingBlock, DEFAULT_TEMPORARY_NS};
use crate::filter::ResolvedFilter;

/// A single-partition replay that rows are pushed into as they come.
pub struct LiveReplay<'f> {
    ctx: Ctx<'f>,
    /// One partition, in a slice for [`fold_partitions`].
    partition: [Partition; 1],
    packed: Packed,
    rows: u64,
}

impl<'f> LiveReplay<'f> {
    /// An empty replay of the rows `filter` selects.
    pub fn new(filter: &'f ResolvedFilter) -> Self {
        let processes = ProcessIndex::default();
        LiveReplay {
            ctx: Ctx::new(1, filter, DEFAULT_TEMPORARY_NS),
            partition: [Partition::new(0, &processes, Sampler::new(None))],
            packed: Packed::default(),
            rows: 0,
        }
    }

    /// Replays the next rows, which follow the last ones pushed.
    pub fn push(&mut self, rows: Slices<'_>) {
        if rows.ts.is_empty() {
            return;
        }
        self.packed.ops.clear();
        self.packed.rows.clear();
        pack_only(rows, &self.ctx, &mut self.packed);
        self.partition[0].replay_packed(&self.packed, &self.ctx);
        self.rows += rows.ts.len() as u64;
    }

    /// Rows pushed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Pushes the rows of `trace` from the first one not pushed yet up to
    /// row `upto` (exclusive, counted from 0 over the whole trace): a
    /// follower that missed batches catches up from the files.
    pub fn catch_up(&mut self, trace: &Trace, upto: u64) -> memleak_trace::Result<()> {
        let decoder = Decoder::new(trace);
        let mut first = 0u64;
        for unit in &trace.event_units() {
            let (start, end) = (first, first + unit.rows);
            first = end;
            if end <= self.rows {
                continue;
            }
            if start >= upto {
                break;
            }
            // Row numbers of the unit's pieces as they come.
            let mut at = start;
            decoder.stream(unit, &mut |b: Slices<'_>| {
                let n = b.ts.len() as u64;
                let (from, to) = (self.rows.max(at), upto.min(at + n));
                if from < to {
                    self.push(b.range((from - at) as usize, (to - at) as usize));
                }
                at += n;
                at < upto
            })?;
        }
        Ok(())
    }

    /// Folds every block outstanding after the rows pushed so far, as
    /// [`Replay::fold_outstanding`](super::Replay::fold_outstanding) does
    /// at the end of a replay.
    pub fn fold_outstanding<T: Send>(
        &self,
        init: impl Fn() -> T + Sync,
        fold: impl Fn(&mut T, &OutstandingBlock) + Sync,
    ) -> Vec<T> {
        fold_partitions(&self.partition, init, fold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Filter;
    use crate::replay::{replay, ReplayOptions};
    use memleak_trace::events::Columns;
    use memleak_trace::{Event, EventKind, Meta, Trace, TraceWriter, WriterOptions};
    use std::sync::{Arc, Mutex};

    /// Every block as (pid, addr, size, ts, stack, mapping id), sorted.
    type Blocks = Vec<(Option<u32>, u64, u64, u64, u64, Option<u64>)>;

    fn sorted(parts: Vec<Blocks>) -> Blocks {
        let mut v: Blocks = parts.into_iter().flatten().collect();
        v.sort_unstable();
        v
    }

    fn fold(b: &mut Blocks, o: &OutstandingBlock) {
        b.push((o.pid, o.addr, o.size, o.ts, o.stack, o.mapping));
    }

    /// A live replay fed by the writer's tap, in batches that cut through
    /// reallocs, mappings and process events, holds the blocks a replay
    /// of the written trace finds: at every checkpoint the tap is
    /// flushed at, and at the end. The events: heap blocks made, freed
    /// and moved by realloc; mappings mapped, partly unmapped and
    /// remapped; a fork whose child inherits and frees some of its
    /// parent's blocks; an exec; an exit; and frees of blocks nobody
    /// allocated.
    #[test]
    fn follows_the_trace_as_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut w = TraceWriter::create(&path, Meta::default(), WriterOptions::default()).unwrap();
        let batches: Arc<Mutex<Vec<Columns>>> = Arc::default();
        let sink = batches.clone();
        w.tap_events(Box::new(move |c: &mut Columns| {
            sink.lock().unwrap().push(std::mem::take(c));
        }));
        let filter = Filter::default().resolve(0);
        let mut live = LiveReplay::new(&filter);
        // Fed its first batches only, then caught up from the files at
        // each check.
        let mut lagging = LiveReplay::new(&filter);
        let mut fed = 0;
        let mut feed = |live: &mut LiveReplay<'_>, lagging: &mut LiveReplay<'_>| {
            for c in batches.lock().unwrap().drain(..) {
                live.push(c.slices(c.len()));
                if fed < 3 {
                    lagging.push(c.slices(c.len()));
                    fed += 1;
                }
            }
        };
        let mut ts = 1_000u64;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut checks = 0;
        for step in 0..20_000u64 {
            ts += 1 + next() % 3;
            let r = next();
            let pid = [7u32, 7, 7, 8][(r % 4) as usize];
            let addr = 0x1000 + (next() % 512) * 0x40;
            let ev = |kind, addr, size, old_addr: Option<u64>, old_size: Option<u64>| Event {
                ts_ns: ts,
                pid,
                tid: pid,
                kind,
                addr,
                size,
                old_addr,
                old_size,
                stack_id: Some(1 + r % 5),
            };
            let e = match (r >> 8) % 16 {
                0..=4 => ev(EventKind::Malloc, addr, 1 + r % 100, None, None),
                5 => ev(EventKind::Calloc, addr, 16, None, None),
                6..=9 => ev(EventKind::Free, addr, 0, None, None),
                10 => ev(
                    EventKind::Realloc,
                    addr,
                    200,
                    Some(0x1000 + (next() % 512) * 0x40),
                    None,
                ),
                11 => {
                    let m = 0x7f00_0000_0000 + (next() % 16) * 0x10_0000;
                    ev(EventKind::Mmap, m, 0x4_0000, None, None)
                }
                12 => {
                    let m = 0x7f00_0000_0000 + (next() % 16) * 0x10_0000 + 0x1000;
                    ev(EventKind::Munmap, m, 0x2000, None, None)
                }
                13 => {
                    let m = 0x7f00_0000_0000 + (next() % 16) * 0x10_0000;
                    ev(
                        EventKind::Mremap,
                        m + 0x8_0000,
                        0x6000,
                        Some(m),
                        Some(0x4_0000),
                    )
                }
                14 if step % 2000 == 0 => ev(EventKind::Fork, 8, 0, None, None),
                14 if step % 3001 == 0 => ev(EventKind::Exec, 0, 0, None, None),
                15 if step % 5003 == 0 => ev(EventKind::Exit, 0, 0, None, None),
                _ => ev(EventKind::Free, 0x9_0000 + addr, 0, None, None),
            };
            w.push_event(&e).unwrap();
            if next() % 300 == 0 {
                // A batch ends here.
                w.flush_events().unwrap();
                feed(&mut live, &mut lagging);
            }
            if step % 7_919 == 7_918 {
                // A scan: the rows so far, live and from the files.
                w.flush_events().unwrap();
                w.rotate().unwrap();
                feed(&mut live, &mut lagging);
                let trace = Trace::open(&path).unwrap();
                let opts = ReplayOptions {
                    filter: Filter::default().resolve(0),
                    ..ReplayOptions::default()
                };
                let want = sorted(
                    replay(&trace, &opts)
                        .unwrap()
                        .fold_outstanding(Vec::new, fold),
                );
                let got = sorted(live.fold_outstanding(Vec::new, fold));
                assert_eq!(live.rows(), step + 1);
                assert!(want.len() > 100, "{} blocks", want.len());
                assert_eq!(got, want, "after {} rows", step + 1);
                assert!(lagging.rows() < step + 1);
                lagging.catch_up(&trace, step + 1).unwrap();
                assert_eq!(lagging.rows(), step + 1);
                let caught = sorted(lagging.fold_outstanding(Vec::new, fold));
                assert_eq!(caught, want, "caught up after {} rows", step + 1);
                checks += 1;
            }
        }
        w.flush_events().unwrap();
        feed(&mut live, &mut lagging);
        w.finish().unwrap();
        let trace = Trace::open(&path).unwrap();
        let want = sorted(
            replay(&trace, &ReplayOptions::default())
                .unwrap()
                .fold_outstanding(Vec::new, fold),
        );
        assert_eq!(sorted(live.fold_outstanding(Vec::new, fold)), want);
        assert!(want.iter().any(|b| b.5.is_some()), "mappings outstanding");
        assert!(want.iter().any(|b| b.0 == Some(8)), "the child's blocks");
        assert_eq!(checks, 2);
    }
}
