//! The segmented writer.
//!
//! Each table is written as a sequence of segments. A segment is written to
//! `part-NNNNN.parquet.inprogress`; closing it writes the footer, fsyncs,
//! lists it in `meta.json` (rows, length, CRC-32) and only then renames it
//! to `part-NNNNN.parquet`. So every `*.parquet` file a reader (or a DuckDB
//! glob) sees is complete, `meta.json` says which files make up the trace,
//! and a killed or out-of-space recorder never damages a closed segment.
//!
//! All tables close their segments together at a *checkpoint*, every
//! second by default, and the first time soon after the first events: a
//! killed recorder loses at most the events since the last one, even in
//! its first second. Stacks, frames and maps close before events, so a listed
//! events segment never refers to a stack that is not listed too. One
//! segment a second would make thousands of files in an hour, so every
//! `merge_segments` closed segments of a table are merged into one
//! (`part-AAAAA-BBBBB.parquet`) by copying their column chunks as they are,
//! without decoding them (docs/format.md, "Segments and their lifecycle").
//! The writer holds the trace's lock ([`TraceLock`]) from before it writes
//! anything until it is dropped (docs/format.md, "The lock").
//!
//! Here is the [`TraceWriter`] itself; `options` holds its tuning and the
//! tables' Parquet settings, `segments` a table's segment files, `rows`
//! and `event_rows` the row buffers.

mod event_rows;
mod options;
mod rows;
mod segments;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::directory::lock_output;
use crate::error::{Error, Result};
use crate::lock::TraceLock;
use crate::meta::{Meta, ScanInfo, SegmentEntry};
use crate::schema::{Event, EventKind, FrameRecord, MapRecord, ScanRecord, StackRecord, Table};
use event_rows::EventRows;
use options::{events_props, frames_props, plain_props};
use rows::{FrameRows, MapRows, Rows, ScanRows, StackRows};
use segments::{in_progress, merge_segments, segment_name, TableSegments};

pub use crate::directory::remove_trace;
pub use event_rows::EventsTap;
pub use options::WriterOptions;

/// Writes a trace directory.
pub struct TraceWriter {
    root: PathBuf,
    opts: WriterOptions,
    meta: Meta,
    events: TableSegments<EventRows>,
    stacks: TableSegments<StackRows>,
    frames: TableSegments<FrameRows>,
    maps: TableSegments<MapRows>,
    scan: TableSegments<ScanRows>,
    segment_started: Instant,
    /// When [`tick`](Self::tick) first saw events, until a checkpoint has
    /// listed some.
    first_events_seen: Option<Instant>,
    events_written: u64,
    /// Held from before anything is written until the writer is dropped.
    lock: TraceLock,
    /// Events pushed since the counters in `meta` were last brought up to
    /// date, by kind code: a map update per event would cost more than
    /// encoding it.
    kind_counts: Box<[u64; 256]>,
    /// Buffered events at which `push_event` hands a batch over: a full
    /// batch, or fewer when the segment fills first.
    events_drain_at: usize,
}

impl TraceWriter {
    /// Creates the trace directory, locks it ([`TraceLock`]) and writes an
    /// initial `meta.json` with `complete: false`. Refuses an existing path
    /// unless `opts.force`, and even then replaces only an empty directory
    /// or a memleak trace ([`remove_trace`]) that no other recorder holds
    /// ([`Error::Locked`]). What it wrote is removed again if it fails.
    pub fn create(root: impl AsRef<Path>, mut meta: Meta, opts: WriterOptions) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let (lock, made) = lock_output(&root, opts.force)?;
        meta.complete = false;
        meta.segments = Some(Default::default());
        meta.checkpoint_ns = meta.start_ns;
        if let Err(e) = meta.store(&root) {
            lock.remove_file();
            if made {
                let _ = fs::remove_dir(&root);
            }
            return Err(e);
        }
        let batch = 64 * 1024;
        let mut writer = TraceWriter {
            events: TableSegments::new(
                &root,
                Table::Events,
                EventRows::new(batch),
                events_props(&opts),
                batch,
            ),
            stacks: TableSegments::new(
                &root,
                Table::Stacks,
                StackRows::default(),
                plain_props(Table::Stacks, &opts),
                8192,
            ),
            frames: TableSegments::new(
                &root,
                Table::Frames,
                FrameRows::default(),
                frames_props(&opts),
                8192,
            ),
            maps: TableSegments::new(
                &root,
                Table::Maps,
                MapRows::default(),
                plain_props(Table::Maps, &opts),
                8192,
            ),
            scan: TableSegments::new(
                &root,
                Table::Scan,
                ScanRows::default(),
                plain_props(Table::Scan, &opts),
                8192,
            ),
            root,
            opts,
            meta,
            segment_started: Instant::now(),
            first_events_seen: None,
            events_written: 0,
            lock,
            kind_counts: Box::new([0; 256]),
            events_drain_at: 1,
        };
        writer.update_drain_at();
        Ok(writer)
    }

    /// The trace directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The trace's lock. A clone keeps the trace locked after the writer
    /// is gone, until it is dropped too: to remove a trace that recorded
    /// nothing without another recorder taking it meanwhile.
    pub fn lock(&self) -> TraceLock {
        self.lock.clone()
    }

    /// The metadata that [`finish`](Self::finish) will write; counters may
    /// be updated through it.
    pub fn meta_mut(&mut self) -> &mut Meta {
        self.sync_counters();
        &mut self.meta
    }

    /// Adds the per-kind counts gathered by `push_event` to the metadata.
    fn sync_counters(&mut self) {
        for (code, n) in self.kind_counts.iter_mut().enumerate() {
            if *n == 0 {
                continue;
            }
            let kind = EventKind::from_code(code as u8).expect("counted kinds are valid");
            *self
                .meta
                .counters
                .events
                .entry(kind.name().to_string())
                .or_insert(0) += std::mem::take(n);
        }
    }

    /// Appends an event.
    #[inline]
    pub fn push_event(&mut self, ev: &Event) -> Result<()> {
        self.events.rows.push(ev);
        self.kind_counts[ev.kind as u8 as usize] += 1;
        self.events_written += 1;
        if self.events.rows.len() >= self.events_drain_at {
            self.drain_events()?;
        }
        Ok(())
    }

    /// Hands every batch of events to `tap` as well, when it goes to the
    /// Parquet writer, in the order the rows are written: a reader in the
    /// same process (the recorder's leak scan) then follows the events
    /// without reading the files back. [`flush_events`](Self::flush_events)
    /// hands over the rows buffered so far.
    pub fn tap_events(&mut self, tap: EventsTap) {
        self.events.rows.set_tap(tap);
    }

    /// Hands the buffered events to the segment being written (and to the
    /// tap), without a checkpoint.
    pub fn flush_events(&mut self) -> Result<()> {
        if self.events.rows.len() > 0 {
            self.drain_events()?;
        }
        Ok(())
    }

    /// Whether the next [`push_event`](Self::push_event) fills the events
    /// segment and so makes a checkpoint. A caller that holds rows of
    /// other tables back (the recorder keeps stacks until their frames are
    /// symbolized) writes them first: a listed events segment must never
    /// refer to a stack that no listed segment holds.
    #[inline]
    pub fn next_event_checkpoints(&self) -> bool {
        let pending = self.events.rows.len() + 1;
        pending >= self.events_drain_at
            && self.events.rows_in_segment + pending >= self.opts.segment_rows
    }

    /// Hands a full batch of events to the Parquet writer; rotates when the
    /// segment is full.
    #[cold]
    fn drain_events(&mut self) -> Result<()> {
        self.events.drain()?;
        if self.events.rows_in_segment >= self.opts.segment_rows {
            self.rotate()?;
        }
        self.update_drain_at();
        Ok(())
    }

    fn update_drain_at(&mut self) {
        let room = self
            .opts
            .segment_rows
            .saturating_sub(self.events.rows_in_segment);
        self.events_drain_at = self.events.batch_rows.min(room).max(1);
    }

    /// Appends a stack.
    pub fn push_stack(&mut self, s: &StackRecord) -> Result<()> {
        self.stacks.rows.push(s);
        self.stacks.maybe_drain()
    }

    /// Appends a symbolized frame.
    pub fn push_frame(&mut self, f: &FrameRecord) -> Result<()> {
        self.frames.rows.push(f);
        self.frames.maybe_drain()
    }

    /// Appends a memory-map line.
    pub fn push_map(&mut self, m: &MapRecord) -> Result<()> {
        self.maps.rows.push(m);
        self.maps.maybe_drain()
    }

    /// Adds a reachability scan: its entry in `meta.json` `scans` and its
    /// rows in the `scan` table, both written at the next checkpoint
    /// ([`rotate`](Self::rotate)) or at [`finish`](Self::finish), together.
    /// `info.blocks` is set to the number of rows; every row must carry
    /// the scan's `pid` and `ts_ns` (readers match them). A failed scan
    /// has an `error` and usually no rows. Several scans may be added.
    pub fn write_scan(&mut self, mut info: ScanInfo, rows: &[ScanRecord]) -> Result<()> {
        debug_assert!(
            rows.iter()
                .all(|r| r.pid == info.pid && r.ts_ns == info.ts_ns),
            "scan rows of another scan"
        );
        info.blocks = rows.len() as u64;
        for r in rows {
            self.scan.rows.push(r);
            self.scan.maybe_drain()?;
        }
        self.meta.scans.push(info);
        Ok(())
    }

    /// Rows written to `events` so far.
    pub fn events_written(&self) -> u64 {
        self.events_written
    }

    /// Makes a checkpoint if the segment duration has passed, or, before
    /// any events segment was listed, `first_checkpoint` after this was
    /// first called with events pushed. Call it from the recorder's timer
    /// (every few milliseconds).
    pub fn tick(&mut self) -> Result<()> {
        let mut due = self.segment_started.elapsed() >= self.opts.segment_duration;
        if self.events.next_index == 0 && self.events_written > 0 {
            let seen = *self.first_events_seen.get_or_insert_with(Instant::now);
            due |= seen.elapsed() >= self.opts.first_checkpoint;
        }
        if due {
            self.rotate()?;
        }
        Ok(())
    }

    /// A checkpoint: closes every open segment, lists them in `meta.json`
    /// with the counters so far, renames them into place, and merges a
    /// table's segments once `merge_segments` of them have closed.
    pub fn rotate(&mut self) -> Result<()> {
        self.checkpoint()?;
        self.merge(false)
    }

    fn checkpoint(&mut self) -> Result<()> {
        self.sync_counters();
        // Stacks, frames and maps first: a listed events segment must never
        // refer to a stack that is not in a listed stacks segment.
        let closed = [
            (Table::Stacks, self.stacks.close_segment()?),
            (Table::Frames, self.frames.close_segment()?),
            (Table::Maps, self.maps.close_segment()?),
            (Table::Scan, self.scan.close_segment()?),
            (Table::Events, self.events.close_segment()?),
        ];
        self.update_drain_at();
        self.segment_started = Instant::now();
        let manifest = self.meta.segments.get_or_insert_with(Default::default);
        for (table, c) in &closed {
            if let Some(c) = c {
                manifest
                    .entry(table.name().to_string())
                    .or_default()
                    .push(c.entry.clone());
            }
        }
        self.meta.checkpoint_ns = crate::meta::clock_ns(libc::CLOCK_MONOTONIC);
        // Listed first, renamed second: a crash in between leaves a listed
        // `.inprogress` file that readers recognize by its length and CRC.
        self.meta.store(&self.root)?;
        for c in closed.into_iter().filter_map(|(_, c)| c) {
            fs::rename(&c.tmp, &c.path).map_err(|e| Error::io(&c.path, e))?;
        }
        Ok(())
    }

    /// Merges a table's unmerged segments when `merge_segments` of them
    /// have closed, when they hold `segment_rows` rows together, or (`all`)
    /// at the end. A segment closed because it was full (half of
    /// `segment_rows` or more) is large enough as it is: it is never copied,
    /// and the smaller ones before it are merged without it.
    fn merge(&mut self, all: bool) -> Result<()> {
        let (n, full) = (self.opts.merge_segments, self.opts.segment_rows as u64);
        if n < 2 {
            return Ok(());
        }
        let root = self.root.clone();
        let manifest = self.meta.segments.get_or_insert_with(Default::default);
        let mut changed = Vec::new();
        for (table, unmerged) in [
            (Table::Stacks, &mut self.stacks.unmerged),
            (Table::Frames, &mut self.frames.unmerged),
            (Table::Maps, &mut self.maps.unmerged),
            (Table::Scan, &mut self.scan.unmerged),
            (Table::Events, &mut self.events.unmerged),
        ] {
            // A checkpoint that failed part way (a full disk) closed
            // segments it never listed: they are not the trace's, and
            // never merged.
            let listed = manifest.get(table.name());
            unmerged.retain(|&(i, _)| {
                listed.is_some_and(|l| l.iter().any(|e| e.file == segment_name(i)))
            });
            let large_last = unmerged.last().is_some_and(|&(_, rows)| rows >= full / 2);
            let rows: u64 = unmerged.iter().map(|&(_, r)| r).sum();
            if !(all || large_last || unmerged.len() >= n || rows >= full) {
                continue;
            }
            let small = &unmerged[..unmerged.len() - usize::from(large_last)];
            if small.len() >= 2 {
                let entries = manifest.entry(table.name().to_string()).or_default();
                // The listed unmerged segments are the last entries.
                let first = entries.len() - unmerged.len();
                let dir = root.join(table.name());
                let (a, b) = (small[0].0, small[small.len() - 1].0);
                let name = format!("part-{a:05}-{b:05}.parquet");
                let path = dir.join(&name);
                let parts = &entries[first..first + small.len()];
                let entry = merge_segments(&dir, parts, &in_progress(&path), name)?;
                let parts: Vec<SegmentEntry> = entries
                    .splice(first..first + small.len(), [entry])
                    .collect();
                changed.push((dir, parts, path));
            }
            unmerged.clear();
        }
        if changed.is_empty() {
            return Ok(());
        }
        // The merged segments replace their parts in `meta.json` first;
        // the parts go before the merged file takes its name, so a glob
        // never sees a row twice. A crash in between leaves a listed
        // `.inprogress` file, which readers recognize.
        self.meta.store(&self.root)?;
        for (dir, parts, path) in changed {
            for part in parts {
                let p = dir.join(&part.file);
                fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
            }
            fs::rename(in_progress(&path), &path).map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }

    /// Closes everything, merges what is left to merge, and writes the
    /// final `meta.json` with `complete: true`.
    pub fn finish(mut self) -> Result<Meta> {
        self.checkpoint()?;
        self.merge(true)?;
        if self.meta.end_ns == 0 {
            self.meta.end_ns = crate::meta::clock_ns(libc::CLOCK_MONOTONIC);
        }
        self.meta.complete = true;
        self.meta.store(&self.root)?;
        // Complete: nothing left for a lock file to say. The lock itself
        // is held until the writer (and every clone of it) is dropped.
        self.lock.remove_file();
        Ok(self.meta)
    }
}
